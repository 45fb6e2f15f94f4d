"""Drift on the wine DAGs: batch scoring reports it per column, a drifted file updates the drift
Asset, and the scoring run retrains the served model's own run, with its Params, its note saying why.

The runs are ``wine_regression``'s (tests/dags/conftest.py): the pipeline run that promoted the
model (which kept its run with it), the scoring of new wines drawn as the training wines were, and
the scoring of shifted wines (``write_shifted_wines``), whose ``retrain`` task triggered the run.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_ray_ml.drift_retrain import RUN_ID_PREFIX
from airflow_ray_ml.serve_history import read_run_record, serving_dir
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.wine import DRIFT_ASSET
from tests.conftest import ROOT, load_dag
from tests.dags.conftest import SHIFTED_COLUMNS
from tests.dags.wine_runs import SMALL, WINE_APP, asset_events
from tests.operators.test_ray_job import _xcom

PIPELINE = "wine_quality_pipeline"


@pytest.mark.integration
def test_new_wines_drawn_as_the_training_wines_have_not_drifted_and_emit_no_drift_event(wine_regression):
    drift = _xcom(wine_regression.scoring, "score")["drift"]
    # 400 rows: a column's PSI is noisy (about 9/400 on average), so "watch" may happen; drift may not
    assert drift["verdict"] != "drift" and drift["drifted"] == [], drift
    assert all(entry["psi"] < drift["alert"] for entry in drift["columns"].values()), drift["columns"]
    assert drift["rows"] == 400
    # the report beside the predictions is the XCom's
    report = artifacts.read_json(drift["report_uri"])
    assert drift["report_uri"] == _xcom(wine_regression.scoring, "score")["output_uri"] + ".drift.json"
    assert report["columns"] == drift["columns"] and report["verdict"] == drift["verdict"]
    assert all(event.get("run_id") != wine_regression.scoring.run_id for event in asset_events(DRIFT_ASSET))


@pytest.mark.integration
def test_shifted_wines_drift_on_exactly_the_moved_columns_and_update_the_drift_asset(wine_regression):
    run = wine_regression.drifted
    assert run.states["score"] == "success", run.states
    scored = _xcom(run, "score")
    drift = scored["drift"]
    assert drift["verdict"] == "drift" and set(drift["drifted"]) == set(SHIFTED_COLUMNS), drift
    assert drift["columns"]["type"]["unseen"] == pytest.approx(0.1, abs=0.01)
    assert drift["reason"].startswith(f"drift in {drift['drifted'][0]} (PSI ")
    # the rosé rows were scored as a missing type, which the model imputes (nan_policy 'impute'): all scored
    assert scored["missing_values"] == "impute" and scored["rows_dropped"] == 0 and scored["rows"] == 600
    events = [event for event in asset_events(DRIFT_ASSET) if event.get("run_id") == run.run_id]
    assert len(events) == 1, events
    (event,) = events
    assert event["reason"] == drift["reason"] and event["input_uri"] == wine_regression.shifted
    assert event["model_version"] == scored["model_version"] and event["drift"]["drifted"] == drift["drifted"]


def _retraining_runs() -> list:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == PIPELINE, DagRun.run_id.like(f"{RUN_ID_PREFIX}%")).all()
        return [SimpleNamespace(run_id=run.run_id, note=run.note, conf=dict(run.conf or {}), run_type=run.run_type)
                for run in runs]


def _notes(run, task_id: str) -> tuple[str | None, str | None]:
    """The note of ``run`` (dag_id, run_id) and of its task ``task_id``."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        dag_run = session.query(DagRun).filter_by(dag_id=run.dag_id, run_id=run.run_id).one()
        ti = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id).one()
        return dag_run.note, ti.note


@pytest.mark.integration
def test_a_promotion_keeps_the_run_that_trained_the_model_with_its_params(wine_regression, artifact_root):
    pipeline = load_dag(PIPELINE, ROOT / "dags")
    version = _xcom(wine_regression.pipeline, "train")["model_version"]
    record = read_run_record(serving_dir(artifact_root, WINE_APP), version)
    assert record["dag_id"] == PIPELINE and record["run_id"] == wine_regression.pipeline.run_id
    # every Param as that run resolved it: its conf where given, the DAG's defaults elsewhere
    assert set(record["params"]) == set(pipeline.params)
    conf = {**SMALL, "require_gpu": False}
    assert {key: record["params"][key] for key in conf} == conf
    assert record["params"]["label_column"] == pipeline.params["label_column"]


@pytest.mark.integration
def test_the_drifted_file_retrains_the_served_models_own_run_with_its_params_and_a_note_naming_the_drift(
        wine_regression, artifact_root):
    drift = _xcom(wine_regression.drifted, "score")["drift"]
    version = _xcom(wine_regression.drifted, "score")["model_version"]
    record = read_run_record(serving_dir(artifact_root, WINE_APP), version)
    # the stable scoring retrained nothing: its planning task was skipped
    assert wine_regression.scoring.states.get("retraining") == "skipped", wine_regression.scoring.states
    assert wine_regression.drifted.states["retrain"] == "success", wine_regression.drifted.states
    runs = [run for run in _retraining_runs() if run.run_id == f"{RUN_ID_PREFIX}{wine_regression.drifted.run_id}"]
    assert len(runs) == 1, _retraining_runs()
    (run,) = runs
    # the served model's own run again: its Params exactly (source, label, settings, rollout, approval)
    assert run.conf == record["params"]
    assert run.note == (f"Started by {drift['reason']} in {wine_regression.shifted} (model {version}; scoring run "
                        f"{wine_regression.drifted.run_id}), with the source and settings of {PIPELINE} run "
                        f"{wine_regression.pipeline.run_id}, which trained it")
    # and the other way: the scoring run's and its score task's note give the verdict and name this run
    run_note, task_note = _notes(wine_regression.drifted, "score")
    assert task_note == f"Drift: {drift['reason']}; retraining run {run.run_id} started"
    assert task_note in run_note
    stable_run_note, stable_task_note = _notes(wine_regression.scoring, "score")
    assert stable_task_note.startswith("No drift (") and "retraining" not in stable_task_note
    assert stable_task_note in stable_run_note
    assert all(column in run.note for column in SHIFTED_COLUMNS)
    # the pipeline is no longer scheduled on the drift Asset: nothing but this run retrains
    assert type(load_dag(PIPELINE, ROOT / "dags").timetable).__name__ in ("CronTriggerTimetable", "NullTimetable")


@pytest.mark.integration
def test_a_retraining_of_a_teams_table_reads_its_source_and_label_and_asks_for_approval_again(
        wine_regression, artifact_root, tmp_path):
    """What the retraining run does with a kept run's Params where the served model was trained on a
    team's own file, label and approval: the pipeline's data tasks read that file (no demo data is
    generated) and its deploy would ask for approval. The Params are the drift run's, with the
    team's source, label and approval in place of the demo's."""
    from airflow_ray_ml_stages import wine

    (run,) = [run for run in _retraining_runs() if run.run_id == f"{RUN_ID_PREFIX}{wine_regression.drifted.run_id}"]
    table = Path(artifact_root) / "data" / "team" / "wines.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    frame = wine.generate(300, seed=5).rename(columns={"quality": "grade"})
    frame.to_csv(table, index=False)
    conf = {**run.conf, "source": [str(table)], "label_column": "grade", "approval": True}
    pipeline = load_dag(PIPELINE, ROOT / "dags")
    subset = pipeline.partial_subset(task_ids=["pick_data", "demo_data", "data_files"], include_upstream=False)
    when = datetime(2026, 4, 9, tzinfo=timezone.utc)
    dag_run = subset.test(logical_date=when, run_after=when, run_conf=conf)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states == {"pick_data": "success", "demo_data": "skipped", "data_files": "success"}, states
    assert _xcom(dag_run, "data_files") == [str(table)]
    rendered = {task.task_id: task for task in pipeline.tasks}
    assert rendered["deploy"].approval == "{{ params.approval }}" and dag_run.conf["approval"] is True
    assert rendered["preprocess"].label_column == "{{ params.label_column }}" and dag_run.conf["label_column"] == "grade"


def test_new_labelled_data_is_read_after_the_served_models_own_source_and_not_alone(tmp_path):
    """The scoring DAG's ``retrain_with``: the retraining reads the model's own files, then the new
    ones, and says so in its note; for a model of the generated demo data it starts nothing."""
    from airflow_ray_ml.drift_retrain import retraining_run
    from airflow_ray_ml.serve_history import run_record_uri

    root = str(tmp_path / "artifacts")
    manifest = {"drift": {"verdict": "drift", "reason": "drift in sqm (PSI 0.41)"}, "model_version": "v7",
                "input_uri": "/data/rent/june.csv"}
    params = {"source": ["/data/rent/2025.csv"], "label_column": "rent", "approval": True}
    for app, kept in (("rent", params), ("demo", {**params, "source": None})):
        artifacts.write_json_atomic(run_record_uri(serving_dir(root, app), "v7"),
                                    {"dag_id": "wine_quality_pipeline", "run_id": "manual__1", "params": kept})
    new = ["/data/rent/2026-q1.csv", "/data/rent/2025.csv"]  # a file the model already read is read once
    plan, why = retraining_run(manifest, {"app": "rent", "model_version": "v7"}, root, "scored__1",
                               "wine_quality_pipeline", new)
    assert plan["conf"] == {**params, "source": ["/data/rent/2025.csv", "/data/rent/2026-q1.csv"]}
    assert plan["note"].endswith("which trained it, plus the new rows of /data/rent/2026-q1.csv, /data/rent/2025.csv")
    assert plan["run_id"] == f"{RUN_ID_PREFIX}scored__1"
    plain, _ = retraining_run(manifest, {"app": "rent", "model_version": "v7"}, root, "scored__1", "wine_quality_pipeline")
    assert plain["conf"] == params and "new rows" not in plain["note"]
    plan, why = retraining_run(manifest, {"app": "demo", "model_version": "v7"}, root, "scored__2",
                               "wine_quality_pipeline", new)
    assert plan is None and "trained on generated demo data" in why
