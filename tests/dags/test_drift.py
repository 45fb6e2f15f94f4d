"""Drift on the wine DAGs: batch scoring reports it per column, a drifted file updates the drift
Asset, and the pipeline that Asset schedules starts a retraining run whose note says why.

The runs are ``wine_regression``'s (tests/dags/conftest.py): the scoring of new wines drawn as the
training wines were, and the scoring of shifted wines (``write_shifted_wines``). The retraining
run is started by Airflow's real scheduler from the drift event those runs left in the test DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.wine import DRIFT_ASSET
from tests.conftest import ROOT, load_dag
from tests.dags.conftest import SHIFTED_COLUMNS
from tests.dags.wine_runs import asset_events
from tests.operators.test_ray_job import _xcom
from tests.scheduler import running_scheduler

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


def _drift_runs() -> list:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == PIPELINE,
                                            DagRun.run_type == DagRunType.ASSET_TRIGGERED).all()
        return [(run.run_id, run.note, [dict(event.extra or {}) for event in run.consumed_asset_events])
                for run in runs]


def _set_default_pool_slots(slots: int) -> int:
    """Give Airflow's default pool ``slots``; return what it had. With none, the scheduler starts a run
    but queues none of its tasks: no task process loads the 2-CPU machine that other tests share."""
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    with create_session() as session:
        pool = session.query(Pool).filter(Pool.pool == Pool.DEFAULT_POOL_NAME).one()
        before, pool.slots = pool.slots, slots
        return before


def _end(run_ids: list[str]) -> None:
    """Mark the runs the scheduler started, and their tasks, failed: nothing of them is left to run."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    with create_session() as session:
        session.query(TaskInstance).filter(TaskInstance.dag_id == PIPELINE, TaskInstance.run_id.in_(run_ids)).update(
            {TaskInstance.state: TaskInstanceState.FAILED}, synchronize_session=False)
        session.query(DagRun).filter(DagRun.dag_id == PIPELINE, DagRun.run_id.in_(run_ids)).update(
            {DagRun.state: DagRunState.FAILED}, synchronize_session=False)


@pytest.mark.integration
def test_the_drift_event_starts_a_retraining_run_whose_note_names_the_drifted_columns(
        wine_regression, tmp_path, monkeypatch):
    drift = _xcom(wine_regression.drifted, "score")["drift"]
    # The pipeline as `make run` schedules it (WINE_PIPELINE_SCHEDULE=none): on the drift Asset alone,
    # so the scheduler starts the run the drift event queued and no weekly one beside it.
    monkeypatch.setenv("WINE_PIPELINE_SCHEDULE", "none")
    assert [asset.name for asset in load_dag(PIPELINE, ROOT / "dags").timetable.asset_condition.objects] == [
        DRIFT_ASSET]
    subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize", "--bundle-name", "dags-folder"],
                   check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
    started: list = []
    default_slots = _set_default_pool_slots(0)  # the run starts; none of its tasks is sent to run
    try:
        # the test needs only the run it starts: no task runs, and none could (no API server runs)
        with running_scheduler(tmp_path / "scheduler.log", PIPELINE, "http://127.0.0.1:9"):
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not any(note for _, note, _ in started):
                time.sleep(1)
                started = _drift_runs()
        assert started, (tmp_path / "scheduler.log").read_text()[-3000:]
        (run_id, note, events), = started
        assert [event.get("run_id") for event in events] == [wine_regression.drifted.run_id]
        assert note == (f"Started by {drift['reason']} in {wine_regression.shifted} "
                        f"(model {_xcom(wine_regression.drifted, 'score')['model_version']})"), note
        assert all(column in note for column in SHIFTED_COLUMNS)
        assert json.dumps(events[0]["drift"]["drifted"]) == json.dumps(drift["drifted"])
    finally:
        _set_default_pool_slots(default_slots)
        _end([run_id for run_id, _, _ in started])
        monkeypatch.delenv("WINE_PIPELINE_SCHEDULE")
        subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize", "--bundle-name", "dags-folder"],
                       check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
