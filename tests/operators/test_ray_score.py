"""The batch-scoring stage and RayBatchScoreOperator: on a real local Ray cluster, and its checks before any job.

The model and the new rows are the session's ``trained_models`` (tests/conftest.py); a file scored
in place is a copy, so the fixture's stay as they were.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from airflow.sdk import DAG

from airflow_ray_ml.errors import InvalidSpecError
from airflow_ray_ml.ray_score import RayBatchScoreOperator
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import DataSourceError
from airflow_ray_ml_stages.score import default_output
from airflow_ray_ml_stages.serve import LoadedModel
from airflow_ray_ml_stages.tables import read_tables
from tests.conftest import load_dag, requires_ml_extra
from tests.operators.test_ray_job import _xcom

_RUNS = iter(range(1, 1000))


def _score(**conf):
    when = datetime(2026, 7, 1, tzinfo=timezone.utc) + timedelta(hours=next(_RUNS))
    dag_run = load_dag("score_file").test(logical_date=when, run_after=when, run_conf=conf)
    return dag_run, {ti.task_id: ti.state for ti in dag_run.get_task_instances()}["score"]


@pytest.fixture
def trained(trained_models) -> tuple[dict, list[str]]:
    """The session's better model and its new rows' files (to read, or to copy before scoring)."""
    return trained_models.models["better"], trained_models.new_rows


def _error(dag_run) -> str:
    """The failed stage's reason, from the manifest it left in its artifact directory."""
    from airflow_ray_ml.hooks.ray import RayHook

    task_dir = artifacts.run_dir(RayHook().artifact_root, dag_run.dag_id, dag_run.run_id, "score")
    return artifacts.read_json(artifacts.manifest_uri(task_dir))["error"]


def _read_output(uri: str) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(uri, "*.csv")))
    assert files, f"no CSV files in {uri}"
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


@pytest.mark.integration
def test_scores_a_uci_file_next_to_it_with_the_models_own_predictions(trained, tmp_path):
    model, files = trained
    # a copy: the output is written next to the file scored, and the session's files stay as they are
    red = str(shutil.copyfile(next(f for f in files if f.endswith("winequality-red.csv")),
                              tmp_path / "winequality-red.csv"))
    dag_run, state = _score(input=red, model=model, engine="ray_data")
    assert state == "success"
    result = _xcom(dag_run, "score")
    assert result["engine"] == "ray_data" and result["engine_reason"] == "engine='ray_data' set in the spec"
    assert os.path.dirname(result["output_uri"]) == os.path.dirname(red)
    assert os.path.basename(result["output_uri"]) == f"winequality-red.predictions-{model['model_version']}"
    scored = _read_output(result["output_uri"])
    expected_rows = read_tables([red])
    assert result["rows"] == len(scored) == len(expected_rows) > 0
    assert "quality" not in scored.columns and set(expected_rows.columns) - {"type"} <= set(scored.columns)
    # the same predictions as the model directory loaded outside Ray, row for row (order kept)
    direct = LoadedModel.load(model["model_dir"]).predict_frame(expected_rows)
    np.testing.assert_allclose(scored["predicted_quality"].to_numpy(), direct, rtol=1e-5, atol=1e-5)
    assert result["predictions"]["min"] == pytest.approx(float(direct.min()), abs=1e-4)
    assert not glob.glob(os.path.join(os.path.dirname(red), ".*tmp-*"))

    # scoring the same file again never overwrites the first output; a file this small is scored in
    # the job's driver (engine auto), to the same rows in the same order
    first_mtime = os.path.getmtime(result["output_uri"])
    again, state = _score(input=red, model=model["model_dir"])
    assert state == "success"
    second = _xcom(again, "score")
    assert second["output_uri"] == result["output_uri"] + "-2"
    assert os.path.getmtime(result["output_uri"]) == first_mtime
    assert second["engine"] == "direct" and "<= direct_max_bytes=" in second["engine_reason"], second
    pd.testing.assert_frame_equal(_read_output(second["output_uri"]), scored)
    assert second["predictions"] == pytest.approx(result["predictions"])
    assert not glob.glob(os.path.join(os.path.dirname(red), ".*tmp-*"))


@pytest.mark.integration
def test_bad_values_fail_with_the_column_and_leave_no_output(trained, tmp_path):
    model, files = trained
    frame = read_tables([files[0]]).head(50)
    frame["alcohol"] = frame["alcohol"].astype(object)
    frame.loc[7, "alcohol"] = "lots"
    bad = tmp_path / "bad_wines.csv"
    frame.to_csv(bad, index=False)
    dag_run, state = _score(input=str(bad), model=model, engine="ray_data")  # the error out of an actor
    assert state == "failed"
    error = _error(dag_run)
    assert "column 'alcohol'" in error and "lots" in error and "bad_wines.csv" in error, error
    assert sorted(os.listdir(tmp_path)) == ["bad_wines.csv"]  # neither output nor temporary files


def _score_in_process(tmp_path, **spec) -> str:
    """Run the score stage in this process, as its job's entrypoint would, expecting it to fail before
    it connects to Ray: the reason its manifest gives."""
    from airflow_ray_ml_stages.score import main

    artifact_dir = str(tmp_path / "score-stage")
    assert main(["--spec", json.dumps({**spec, "artifact_dir": artifact_dir})]) == 1
    if "ray" in sys.modules:
        assert not sys.modules["ray"].is_initialized()
    return artifacts.read_json(artifacts.manifest_uri(artifact_dir))["error"]


@requires_ml_extra  # its model is an XGBoost booster
def test_missing_columns_taken_columns_and_unknown_models_are_named_before_ray(tmp_path):
    from tests.include.test_serve import write_flag_model_dir

    model_dir = write_flag_model_dir(tmp_path / "model")
    new = tmp_path / "new"
    new.mkdir()
    pd.DataFrame({"x": [0.5, 1.5]}).to_csv(new / "thin.csv", index=False)
    assert "lacks column(s) ['flag']" in _score_in_process(tmp_path, input_uri=str(new / "thin.csv"),
                                                             model_dir=model_dir)
    pd.DataFrame({"x": [0.5], "flag": [True]}).to_parquet(new / "thin.parquet")
    assert "already has column(s) ['flag']" in _score_in_process(
        tmp_path, input_uri=str(new / "thin.parquet"), model_dir=model_dir, prediction_column="flag")
    assert "is not a model directory" in _score_in_process(tmp_path, input_uri=str(new / "thin.csv"),
                                                          model_dir=str(tmp_path / "no-such-model"))
    assert sorted(os.listdir(new)) == ["thin.csv", "thin.parquet"]


@pytest.mark.integration
def test_scores_a_file_with_a_boolean_column_as_the_endpoint_scores_json_booleans(airflow_db, ray_conn, tmp_path):
    from tests.include.test_serve import write_flag_model_dir

    model_dir = write_flag_model_dir(tmp_path / "model")
    rows = pd.DataFrame({"x": [0.5, 0.5, -1.0, 2.0], "flag": ["True", "False", "yes", "NO"]})
    rows.to_csv(tmp_path / "new.csv", index=False)
    dag_run, state = _score(input=str(tmp_path / "new.csv"), model=model_dir)
    assert state == "success"
    scored = _read_output(_xcom(dag_run, "score")["output_uri"])
    served = LoadedModel.load(model_dir).predict_frame(rows.assign(flag=[True, False, True, False]))
    np.testing.assert_allclose(scored["predicted_y"].to_numpy(), served, rtol=1e-5, atol=1e-5)
    assert served[0] - served[1] == pytest.approx(4, abs=1)  # the flag counts: the label was x + 4 * flag

    rows.loc[2, "flag"] = "maybe"
    rows.to_csv(tmp_path / "bad.csv", index=False)
    dag_run, state = _score(input=str(tmp_path / "bad.csv"), model=model_dir)
    assert state == "failed"
    error = _error(dag_run)
    assert "column 'flag' holds booleans" in error and "maybe" in error and "bad.csv" in error, error


def test_default_output_never_names_an_existing_path(tmp_path):
    base = tmp_path / "wines.csv"
    first = default_output(str(base), "v1")
    assert first == str(tmp_path / "wines.predictions-v1")
    os.makedirs(first)
    assert default_output(str(base), "v1") == first + "-2"


@pytest.mark.parametrize("model", [None, "{{ dag_run.conf.get('model') }}"])  # as given, and as rendered
def test_score_without_model_or_app_name_fails_before_any_job_naming_both_fixes(model):
    with DAG(dag_id="score_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        score = RayBatchScoreOperator(task_id="score", input_uri="/data/new.csv", model=model)
    score.render_template_fields({"dag_run": SimpleNamespace(conf={})})
    with pytest.raises(InvalidSpecError, match=r"task 'score' has no model to score with: pass model= \(a RayTrain "
                                               r"XCom.*\), or app_name= naming the Serve application"):
        score.build_spec({})


def _score_here(tmp_path, frame: pd.DataFrame, model_dir: str, name: str, **spec):
    """The score stage in this process with the direct engine (no Ray job): its result."""
    from airflow_ray_ml_stages.score import run_scoring
    from airflow_ray_ml_stages.specs import ScoreSpec

    path = tmp_path / f"{name}.csv"
    frame.to_csv(path, index=False)
    return run_scoring(ScoreSpec(artifact_dir=str(tmp_path / f"{name}-stage"), input_uri=str(path),
                                 model_dir=model_dir, engine="direct", **spec))


@pytest.mark.integration
def test_the_drift_report_finds_no_drift_in_new_rows_and_names_exactly_the_moved_columns_of_shifted_ones(
        trained, tmp_path):
    model, files = trained
    # the new rows, red and white with their type, mixed: the first rows of a file are a sample of it
    frame = read_tables(files).sample(frac=1.0, random_state=0).reset_index(drop=True)
    stable = _score_here(tmp_path, frame, model["model_dir"], "same")
    assert stable.drift["verdict"] != "drift" and stable.drift["rows"] == len(frame), stable.drift
    assert set(stable.drift["columns"]) == set(LoadedModel.load(model["model_dir"]).input_columns)
    assert artifacts.read_json(stable.drift["report_uri"])["columns"] == stable.drift["columns"]

    shifted = frame.copy()
    shifted["sulphates"] = shifted["sulphates"] + 2 * frame["sulphates"].std()
    shifted["chlorides"] = shifted["chlorides"] - 2 * frame["chlorides"].std()
    shifted.loc[shifted.index[::10], "type"] = "rosé"
    moved = _score_here(tmp_path, shifted, model["model_dir"], "moved", drift_max_rows=500)
    assert moved.drift["verdict"] == "drift" and moved.drift["rows"] == 500  # the first 500 rows only
    assert set(moved.drift["drifted"]) == {"sulphates", "chlorides", "type"}, moved.drift["columns"]
    assert moved.drift["columns"]["type"]["unseen"] == pytest.approx(0.1, abs=0.01)
    assert moved.rows + moved.rows_dropped == len(shifted)  # the rosé rows scored as missing types

    with pytest.raises(DataSourceError, match="'rosé'.*not trained on"):
        _score_here(tmp_path, shifted, model["model_dir"], "refused", unseen_categories="fail")
    off = _score_here(tmp_path, frame, model["model_dir"], "off", drift_max_rows=0)
    assert off.drift == {} and not glob.glob(str(tmp_path / "off.predictions-*.drift.json"))
