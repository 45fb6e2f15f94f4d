"""The wine DAG's Params and its tasks agree: each value the trigger accepts, every task accepts.

No Ray and no browser: the Params are validated as the api-server validates a trigger, and each
task builds what it would build before its Ray job (tests/dags/wine_conf.py). The trigger form
itself, in Chromium: test_trigger_form.py.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT, allow_sources, load_dag
from tests.dags.wine_conf import build_tasks, trigger_params

NO_BOUND = sys.float_info.max


@pytest.fixture(scope="module")
def dag():
    return load_dag("wine_quality_pipeline", ROOT / "dags")


@pytest.fixture
def build(dag, tmp_path, monkeypatch):
    allow_sources(monkeypatch, "/data")  # where these confs' files are (airflow_ray_ml.confine)
    return lambda **conf: build_tasks(dag, conf, str(tmp_path))


def test_params_defaults_build_every_task_on_the_demo_data(build):
    built = build()
    assert built["pick_data"] == ["demo_data", "data_files"]
    assert built["preprocess"]["source"] == built["data_files"]
    assert built["preprocess"]["label_range"] == [0, 10]  # the wine grades', on the demo data only
    assert built["tune"]["searcher"] == "adaptive" and built["tune"]["time_budget_s"] == 900
    assert built["tune"]["cv_folds"] == 5


def test_params_cv_folds_reach_the_tune_spec(build):
    assert build(cv_folds=0)["tune"]["cv_folds"] == 0 and build(cv_folds=3)["tune"]["cv_folds"] == 3


@pytest.mark.parametrize("source", [None, [], [""], ["", "  ", ""]])
def test_params_source_without_a_file_uses_the_demo_data(build, source):
    built = build(source=source)
    assert built["pick_data"] == ["demo_data", "data_files"]
    assert [uri.rsplit("/", 1)[-1] for uri in built["preprocess"]["source"]] == [
        "winequality-red.csv", "winequality-white.csv"]


def test_params_source_lines_arrive_as_files_without_blank_lines(build):
    # what the form's text box sends for two files, a blank line between them and a trailing newline
    built = build(source=["/data/red.csv", "", " /data/white.csv ", ""])
    assert built["pick_data"] == ["data_files"]
    assert built["preprocess"]["source"] == ["/data/red.csv", "/data/white.csv"]
    assert built["preprocess"]["label_range"] is None  # no check on a user's data unless asked


def test_params_data_cleaning_reaches_the_preprocess_spec_as_typed_values(build):
    built = build(source=["/data/hitters.csv"], label_column="Salary", drop_columns=["name", "player id"],
                  nan_policy="drop", max_categories=400)
    assert built["preprocess"]["drop_columns"] == ["name", "player id"]
    assert built["preprocess"]["nan_policy"] == "drop" and built["preprocess"]["max_categories"] == 400
    default = build()["preprocess"]
    assert default["drop_columns"] == [] and default["nan_policy"] == "impute" and default["max_categories"] == 100


def test_params_classification_with_a_threshold_reaches_the_preprocess_spec(build):
    # two classes from the demo's grades (the stage's own tests: tests/include/test_data_classification.py)
    built = build(task="classification", label_threshold=7)
    assert built["preprocess"]["task"] == "classification" and built["preprocess"]["label_threshold"] == 7
    assert built["preprocess"]["label_range"] == [0, 10]  # checked on the raw grades, before the threshold
    regression = build()["preprocess"]
    assert regression["task"] == "regression" and regression["label_threshold"] is None


@pytest.mark.parametrize("accelerator", ["auto", "gpu", "cpu"])
def test_params_accelerator_reaches_the_train_and_tune_specs(build, accelerator):
    built = build(accelerator=accelerator)
    assert built["train"]["accelerator"] == built["tune"]["accelerator"] == accelerator


def test_params_accelerator_defaults_to_the_device_rule(build):
    built = build()
    assert built["train"]["accelerator"] == built["tune"]["accelerator"] == "auto"


@pytest.mark.parametrize(("low", "high", "expected"), [
    (3, 9, [3, 9]),
    (9, 3, [3, 9]),  # the wrong way round: swapped, not a failed preprocess task
    (5, 5, [5, 5]),
    (2.5, None, [2.5, NO_BOUND]),
    (None, -1, [-NO_BOUND, -1]),
    (None, None, None),
])
def test_params_label_bounds_in_any_combination_build_a_valid_range(build, low, high, expected):
    built = build(source=["/data/rent.csv"], label_column="rent", label_min=low, label_max=high)
    assert built["preprocess"]["label_range"] == expected


def test_params_search_space_example_is_a_valid_space_and_replaces_the_form(dag, build):
    from airflow_ray_ml_stages.search_space import SearchSpace

    # the module as the DagBag loaded it: the example the form's help shows
    example = sys.modules[dag.task_dict["pick_data"].python_callable.__module__].SEARCH_SPACE_EXAMPLE
    assert json.dumps(example) in dag.params.get_param("search_space").schema["description_md"]
    SearchSpace(example)
    built = build(search_space=example, families=["lightning"])
    assert built["search_space"] == example and built["tune"]["search_space"] == example


def test_params_search_space_range_high_first_or_equal_reaches_tune_as_given(build):
    # the trigger cannot compare a range's bounds, so the tasks read either order
    space = {"family": "xgboost", "scaler": "standard",
             "xgboost": {"max_depth": {"randint": [9, 3]}, "eta": {"loguniform": [0.3, 0.02]},
                         "subsample": {"uniform": [0.8, 0.8]}}}
    built = build(search_space=space)
    assert built["search_space"] == space and built["tune"]["search_space"] == space


def test_params_empty_search_space_means_the_one_built_from_the_form(build):
    built = build(search_space={}, families=["lightning"], scalers=["none"], max_epochs=3)
    space = built["tune"]["search_space"]
    assert space["family"] == "lightning" and space["scaler"] == "none" and "xgboost" not in space
    assert space["lightning"]["max_epochs"] == 3


@pytest.mark.parametrize(("conf", "message"), [
    ({"families": []}, "families"),
    ({"families": None}, "families"),
    ({"families": ["catboost"]}, "families"),
    ({"scalers": ["standard", "standard"]}, "scalers"),
    ({"source": "/data/red.csv"}, "source"),  # a list of files, one per line in the form
    ({"label_min": "3"}, "label_min"),
    ({"searcher": None}, "searcher"),
    ({"placement_strategy": None}, "placement_strategy"),
    ({"accelerator": "cuda"}, "accelerator"),
    ({"label_column": "  "}, "label_column"),
    ({"nan_policy": "ignore"}, "nan_policy"),
    ({"drop_columns": "name"}, "drop_columns"),  # a list, one column per line in the form
    ({"max_categories": 0}, "max_categories"),
    ({"serve_route": "wine"}, "serve_route"),
    ({"serve_app": "-wine"}, "serve_app"),
    ({"on_schema_change": "ignore"}, "on_schema_change"),
    ({"time_budget_s": 5}, "time_budget_s"),
    ({"cv_folds": 1}, "cv_folds"),  # one fold is no cross-validation: 0 says never
    ({"cv_folds": -1}, "cv_folds"),
    ({"search_space": {"family": "catboost"}}, "search_space"),
    # a space's values, not only its shape: each would fail the search_space task
    ({"search_space": {"family": "xgboost", "xgboost": {"eta": {"loguniform": [0, 0.3]}}}}, "search_space"),
    ({"search_space": {"lightning": {"dropout": 1.5}}}, "search_space"),
    ({"search_space": {"lightning": {"lr": {"uniform": ["a", 1]}}}}, "search_space"),
])
def test_params_refuse_at_trigger_what_a_task_would_refuse(dag, conf, message):
    from airflow.sdk.definitions.param import ParamValidationError

    # (Airflow 3.2 raises a plain ValueError for a serialized DAG's Params, 3.3 ParamValidationError)
    with pytest.raises((ParamValidationError, ValueError), match=f"Invalid input for param {message}"):
        trigger_params(dag, conf)


def test_params_each_has_a_title_and_help(dag):
    for name, param in dag.params.items():
        assert param.schema.get("title") and (param.description or param.schema.get("description_md")), name



def _form_conf(dag, **changed) -> dict:
    """What the trigger form sends: every Param at its default, unless changed."""
    return {**{name: param.value for name, param in dag.params.items()}, **changed}


@pytest.mark.parametrize(("changed", "app", "route"), [
    ({}, "wine-quality", "/wine"),  # the demo keeps its application
    ({"label_column": "Monthly Rent", "source": ["/data/rent.csv"]}, "monthly-rent", "/monthly-rent"),
    ({"label_column": "rent", "serve_app": "", "serve_route": ""}, "rent", "/rent"),  # fields cleared in the form
    ({"label_column": "rent", "serve_route": "/flats"}, "rent", "/flats"),
    ({"label_column": "rent", "serve_app": "flats"}, "flats", "/flats"),  # a route left out follows the app
    ({"serve_app": "wine-two"}, "wine-two", "/wine-two"),
])
def test_params_deploy_fields_left_empty_serve_under_the_label_name(dag, build, changed, app, route):
    built = build(**_form_conf(dag, **changed))
    assert (built["deploy"]["app_name"], built["deploy"]["route_prefix"]) == (app, route)


def test_params_schema_change_setting_reaches_the_deploy(dag, build):
    assert build()["deploy"]["on_schema_change"] == "promote"
    assert build(on_schema_change="refuse")["deploy"]["on_schema_change"] == "refuse"


@pytest.mark.parametrize("source", [["/etc/passwd"], ["/data/red.csv", "/data/../etc/shadow"],
                                    ["http://169.254.169.254/latest/meta-data/"]])
def test_params_source_outside_the_allowed_sources_fails_data_files(build, source):
    from airflow_ray_ml.errors import SourceNotAllowedError

    with pytest.raises(SourceNotAllowedError, match="'allowed_sources' field of the Airflow connection 'ray_default'"):
        build(source=source)
