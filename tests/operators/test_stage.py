"""StageOperator fills a model spec's data fields from a preprocess task's XCom, as the spec declares them."""

from __future__ import annotations

from datetime import datetime

import pytest

from airflow_ray_ml.errors import RayOperatorError
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator
from airflow_ray_ml_stages.specs import PreprocessResult

# A classification manifest as the data stage returns it, every value distinct.
MANIFEST = PreprocessResult(
    split_uris={"train": "/d/train", "validation": "/d/validation", "test": "/d/test"},
    preprocessor_uri="/d/standard.json", profile_uri="/d/profile.json",
    rows={"read": 100, "dropped": 0, "train": 70, "validation": 15, "test": 15}, rows_read=100, rows_dropped=0,
    feature_columns=["alcohol", "acidity"], label_column="grade", fingerprint="f-123",
    preprocessor_variants={"standard": "/d/standard.json", "minmax": "/d/minmax.json"},
    task="classification", classes=["low", "high"],
).to_dict()
DATA_FIELDS = {"train_uri": "/d/train", "validation_uri": "/d/validation", "feature_columns": ["alcohol", "acidity"],
               "label_column": "grade", "classes": ["low", "high"], "preprocessor_uri": "/d/standard.json",
               "preprocessor_variants": {"standard": "/d/standard.json", "minmax": "/d/minmax.json"},
               "data_fingerprint": "f-123"}


class _TI:
    dag_id = "stage_unit"
    map_index = -1


def _spec(operator_type: type, data: dict, tmp_path) -> dict:
    from airflow.sdk import DAG

    with DAG(dag_id="stage_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = operator_type(task_id="model", data=data, artifact_root=str(tmp_path))
    return operator.full_spec({"ti": _TI(), "run_id": "r1"})


@pytest.mark.parametrize(("operator_type", "own"), [(RayTrainOperator, {"test_uri": "/d/test"}), (RayTuneOperator, {})])
def test_stage_operator_preprocess_manifest_fills_every_data_field_of_its_spec(operator_type, own, tmp_path):
    spec = _spec(operator_type, MANIFEST, tmp_path)
    assert {name: spec[name] for name in [*DATA_FIELDS, *own]} == {**DATA_FIELDS, **own}
    assert ("test_uri" in spec) is bool(own)
    assert not set(DATA_FIELDS) & set(operator_type.spec_arguments)  # named once, at the preprocess task


@pytest.mark.parametrize("operator_type", [RayTrainOperator, RayTuneOperator])
def test_stage_operator_manifest_without_classes_or_variants_gives_a_regression_spec(operator_type, tmp_path):
    regression = {key: value for key, value in MANIFEST.items() if key not in ("classes", "preprocessor_variants")}
    spec = _spec(operator_type, regression, tmp_path)
    assert spec["classes"] is None and spec["preprocessor_variants"] is None and spec["data_fingerprint"] == "f-123"


@pytest.mark.parametrize("operator_type", [RayTrainOperator, RayTuneOperator])
def test_stage_operator_manifest_without_its_fingerprint_names_the_missing_field(operator_type, tmp_path):
    data = {key: value for key, value in MANIFEST.items() if key != "fingerprint"}
    with pytest.raises(RayOperatorError, match=r"data lacks \['data_fingerprint'\] .*\(data=preprocess.output\)"):
        _spec(operator_type, data, tmp_path)
