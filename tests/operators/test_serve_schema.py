"""The deploy gate's schema check (airflow_ray_ml.serve_schema): what keeps a champion from scoring a challenger's rows."""

from __future__ import annotations

import json

import pytest
import requests

from airflow_ray_ml.serve_schema import ModelSchema, answer_problems, schema_change_reason, schema_changes
from airflow_ray_ml_stages.preprocessor import Preprocessor

WINE = ["alcohol", "pH", "density"]


def _metadata(columns=WINE, categorical=None, label="quality", task="regression", classes=None) -> dict:
    """A served model's /metadata answer, as airflow_ray_ml_stages.serve writes it."""
    categorical = {"type": ["red", "white"]} if categorical is None else categorical
    return {"model_version": "xgboost-1", "task": task, "classes": classes, "label_column": label,
            "schema": {"input_columns": [*columns, *categorical], "numeric": list(columns),
                       "categorical": categorical, "max_instances": 1024}}


def _challenger(columns=WINE, categorical=None, label="quality", task="regression", classes=None) -> ModelSchema:
    """The challenger's rows, from a preprocessor as the data stage writes it."""
    categorical = {"type": ["red", "white"]} if categorical is None else categorical
    preprocessor = Preprocessor(scaler="standard", numeric_columns=list(columns), categories=categorical,
                                label_column=label, task=task, classes=classes)
    return ModelSchema.from_preprocessor(Preprocessor.from_json(preprocessor.to_json()))


def test_schema_changes_same_columns_label_and_task_none():
    assert schema_changes(ModelSchema.from_metadata(_metadata()), _challenger()) == []


def test_schema_changes_column_the_challenger_lacks_named_as_champion_needs():
    changes = schema_changes(ModelSchema.from_metadata(_metadata()), _challenger(columns=["pH", "density"]))
    assert changes == ["['alcohol'], which the challenger's data lacks"]
    assert schema_change_reason(changes) == "schema changed: champion needs ['alcohol'], which the challenger's data lacks"


@pytest.mark.parametrize(("challenger", "expected"), [
    (dict(columns=[*WINE, "sugar"]), "none of ['sugar'], new in the challenger's data"),
    (dict(categorical={"type": ["red", "white", "rosé"]}), "'type' in ['red', 'white'], the challenger's data also has ['rosé']"),
    (dict(columns=[*WINE, "type"], categorical={}), "'type' as text, the challenger's data has it as a number"),
    (dict(label="rent"), "label 'quality', the challenger predicts 'rent'"),
    (dict(task="classification", classes=[3, 4, 5]), "a regression label, the challenger is a classification model"),
])
def test_schema_changes_new_column_category_kind_label_or_task_each_named(challenger, expected):
    assert schema_changes(ModelSchema.from_metadata(_metadata()), _challenger(**challenger)) == [expected]


def test_schema_changes_other_classes_named_but_their_order_is_no_change():
    champion = ModelSchema.from_metadata(_metadata(task="classification", classes=["bad", "good"]))
    assert schema_changes(champion, _challenger(task="classification", classes=["good", "bad"])) == []
    assert schema_changes(champion, _challenger(task="classification", classes=["bad", "good", "great"])) == [
        "classes ['bad', 'good'], the challenger's are ['bad', 'good', 'great']"]


def test_schema_changes_long_lists_quoted_up_to_ten_and_counted():
    columns = [f"c{index}" for index in range(25)]
    changes = schema_changes(ModelSchema.from_metadata(_metadata(columns=columns)), _challenger(columns=[]))
    assert changes == ["['c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6', 'c7', 'c8', 'c9', … 15 more], which the "
                       "challenger's data lacks"]


def test_schema_changes_champion_without_an_input_schema_compares_label_and_task_only():
    metadata = {**_metadata(), "schema": {}}
    assert schema_changes(ModelSchema.from_metadata(metadata), _challenger(columns=["pH"])) == []
    assert schema_changes(ModelSchema.from_metadata(metadata), _challenger(label="rent")) != []


class _Answer(requests.Response):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__()
        self.status_code, self._content = status, body


def test_answer_problems_names_fields_and_kinds_never_the_values_sent():
    detail = [{"loc": ["body", "instances", row, "alcohol"], "msg": "missing feature", "type": "missing"}
              for row in range(3)]
    detail.append({"loc": ["body", "instances", 0, "type"], "msg": "must be one of ['red'], got 'SECRET-rosé'",
                   "type": "enum"})
    detail.append({"loc": ["body", "instances", 1], "msg": "no finite prediction", "type": "non_finite_prediction"})
    summary = answer_problems(_Answer(422, json.dumps({"detail": detail}).encode()))
    assert summary == "'alcohol' (missing), 'type' (enum), a row (non_finite_prediction)"


@pytest.mark.parametrize("body", [b"<html>Internal Server Error: SECRET</html>", b'{"detail": "SECRET"}', b"[1]"])
def test_answer_problems_body_without_a_problem_list_says_nothing(body):
    assert answer_problems(_Answer(500, body)) == ""
