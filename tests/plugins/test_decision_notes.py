"""Failures become notes (operators/plugins/decision_notes.py): the failed task's note and the run's
note carry the error's first line and the fix it names; the "Ray ML" page lists failed Tune runs.

The note texts are tested as functions; the whole path runs through ``dag.test()``, which calls
the listener in the task's process (the failure record) and as the run ends (the notes), as a
worker and the scheduler do: once without Ray (a Python task that fails in a DAG of this provider,
and in a DAG without it), once with a search whose every trial fails on the test cluster.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow.sdk import DAG, task

from airflow_ray_ml.errors import RayStageError
from airflow_ray_ml.plugins import ray_ml
from airflow_ray_ml.plugins.decision_notes import (
    FAILURE_XCOM_KEY,
    MAX_ERROR_CHARS,
    decision_text,
    failure_record,
    failure_text,
    named_fix,
    note_start,
    started_by_text,
    uses_this_provider,
)
from airflow_ray_ml.plugins.ray_ml_runs import decode_xcom, list_tune_runs, load_tune_run
from airflow_ray_ml.plugins.ray_ml_serving import approval_text
from airflow_ray_ml.ray_job import RayJobOperator
from tests.conftest import load_dag
from tests.dag_fixtures.notes_dags import ERROR, SECRET_CONN_ID

LOGICAL_DATE = datetime(2026, 6, 1, tzinfo=timezone.utc)
TUNE_FIX = "Fix the search space or the data"
# What a failed search's message looks like once RayStageError has wrapped the stage's error.
TUNE_FAILURE = (
    "stage tune failed: TuneError: no trial completed: 4 trial(s), 4 failed, 0 stopped early; first error "
    "(trial 1f2e, xgboost): XGBoostError: [10:12:01] learner.cc:742: Check failed: tree_method: "
    + "x" * 300 + ". Fix the search space or the data (every trial is listed in /a/leaderboard.json), or raise "
    "time_budget_s (Ray job airflow-d-tune-0a1b; not retried, since another try would fail the same way)\n"
    "Traceback (most recent call last):\n  raise TuneError(...)"
)


# -- the texts ------------------------------------------------------------------------------------


def test_failure_record_of_a_long_stage_error_keeps_a_bounded_first_line_and_its_whole_fix():
    record = failure_record(RayStageError(TUNE_FAILURE))
    assert record["error"].startswith("stage tune failed: TuneError: no trial completed: 4 trial(s)")
    assert len(record["error"]) <= MAX_ERROR_CHARS and "Traceback" not in record["error"]
    assert record["fix"] == ("Fix the search space or the data (every trial is listed in /a/leaderboard.json), "
                             "or raise time_budget_s")
    assert record["exception"] == "RayStageError"
    text = failure_text(record)
    assert text.startswith("Failed: stage tune failed") and text.endswith(f"— {record['fix']}")


def test_named_fix_of_errors_that_name_none_is_none():
    assert named_fix("task 'job': entrypoint must be a command, got ''") is None
    assert named_fix("XGBoostError: learner.cc:742: Check failed: tree_method") is None  # a verb, not a fix
    assert named_fix("output_uri '/o.csv' exists: choose another output_uri or leave it empty") == (
        "Choose another output_uri or leave it empty")


def test_failure_text_whose_fix_is_in_the_error_line_says_it_once_and_names_the_task_in_the_run():
    record = failure_record(ValueError(ERROR))
    assert record["error"] == ERROR.splitlines()[0] and record["fix"] == "Give a table with more rows or lower min_rows"
    assert failure_text(record) == f"Failed: {ERROR.splitlines()[0]}"
    assert failure_text(record, "check_rows") == f"check_rows failed: {ERROR.splitlines()[0]}"


def test_a_run_that_drift_started_is_noted_with_the_drift_and_then_its_decisions_after_it():
    from types import SimpleNamespace

    drift = {"reason": "drift in alcohol (PSI 0.41), density (0.28)", "input_uri": "/data/new.csv",
             "model_version": "xgboost-1", "drift": {"verdict": "drift"}}
    promoted = SimpleNamespace(extra={"model_dir": "/m", "model_version": "xgboost-1"})  # not a drift event
    run = SimpleNamespace(note=None, consumed_asset_events=[promoted, SimpleNamespace(extra=drift)])
    text = note_start(run, session=None)
    assert run.note == text == ("Started by drift in alcohol (PSI 0.41), density (0.28) in /data/new.csv "
                                "(model xgboost-1)")
    assert started_by_text([promoted.extra]) is None  # a promotion's event starts no such note
    run.note = "a person's words"
    assert note_start(run, session=None) == text and run.note == "a person's words"  # never replaced


def test_uses_this_provider_only_for_dags_with_its_operators():
    @task
    def plain() -> None:
        pass

    with DAG(dag_id="plain_only", schedule=None) as plain_dag:
        lone = plain()
    with DAG(dag_id="with_ray", schedule=None):
        python_task = plain()
        python_task >> RayJobOperator(task_id="job", entrypoint="true")
    assert not uses_this_provider(plain_dag.get_task(lone.operator.task_id))
    assert uses_this_provider(python_task.operator)


# -- through dag.test() ---------------------------------------------------------------------------


def _failure(dag_run, task_id: str):
    """The failure record ``task_id`` left in the run, or None."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id,
                                                 key=FAILURE_XCOM_KEY).one_or_none()
        return None if row is None else decode_xcom(row.value)


def _notes(dag_run) -> dict[str, str | None]:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_run.dag_id, DagRun.run_id == dag_run.run_id))
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_run.dag_id,
                                                         TaskInstance.run_id == dag_run.run_id)).all()
        return {"run": run.note, **{ti.task_id: ti.note for ti in tis}}


@pytest.mark.integration
def test_failure_notes_failed_python_task_in_a_provider_dag_notes_its_first_line_and_a_plain_dag_none(airflow_db):
    first_line = ERROR.splitlines()[0]
    ours = load_dag("notes_provider_failure").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    assert ours.state == "failed"
    notes = _notes(ours)
    assert notes["check_rows"] == f"Failed: {first_line}"
    assert notes["run"] == f"check_rows failed: {first_line}"
    assert notes["job"] is None  # upstream_failed: it never ran
    assert _failure(ours, "check_rows")["fix"] == "Give a table with more rows or lower min_rows"

    plain = load_dag("notes_plain_failure").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    assert plain.state == "failed"
    assert _notes(plain) == {"run": None, "check_rows": None}
    assert _failure(plain, "check_rows") is None


@pytest.mark.integration
def test_failure_notes_error_quoting_a_connection_password_is_masked(airflow_db, monkeypatch):
    import json

    password = "s3cr3t-pa55word-9431"
    monkeypatch.setenv(f"AIRFLOW_CONN_{SECRET_CONN_ID.upper()}",
                       json.dumps({"conn_type": "http", "login": "svc", "password": password}))
    dag_run = load_dag("notes_secret_failure").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    assert dag_run.state == "failed"
    notes = _notes(dag_run)
    assert notes["log_in"] == "Failed: the service refused svc:***; set a valid password"
    assert password not in notes["run"] and "svc:***" in notes["run"]
    assert password not in json.dumps(_failure(dag_run, "log_in"))


@pytest.mark.integration
def test_failure_notes_failed_tune_run_notes_the_error_and_the_fix_it_names(failed_tune_run):
    notes = _notes(failed_tune_run)
    assert notes["tune"].startswith("Failed: stage tune failed: TuneError: no trial completed: 4 trial(s), 4 failed")
    assert TUNE_FIX in notes["tune"] and "time_budget_s" in notes["tune"]
    assert notes["run"].startswith("tune failed: stage tune failed: TuneError: no trial completed")
    assert TUNE_FIX in notes["run"]


@pytest.mark.integration
def test_ray_ml_page_lists_a_failed_tune_run_with_its_error_and_shows_it_selected(failed_tune_run):
    from airflow.utils.session import create_session

    with create_session() as session:
        runs = list_tune_runs(session, {"tune_only"})
        ours = next(run for run in runs if run.run_id == failed_tune_run.run_id)
        assert ours.failed and ours.error.startswith("stage tune failed: TuneError: no trial completed")
        shown = load_tune_run(session, {"tune_only"}, ours)
        assert load_tune_run(session, {"another_dag"}, ours) is None  # a DAG the user may not read
    assert shown.error == ours.error and shown.fix.startswith(TUNE_FIX) and shown.job_url
    data = ray_ml.PageData(conn_id="ray_default", tune_runs=runs, tune=shown)
    html = ray_ml.render(data)
    assert "failed: stage tune failed: TuneError" in html  # the picker's entry
    assert 'id="tune-failed"' in html and TUNE_FIX in html and 'id="leaderboard"' not in html


def test_a_promotion_a_person_approved_says_who_and_a_rejection_says_why():
    promoted = {"action": "promoted", "challenger_version": "v2", "champion_version": "v1", "metric": "rmse",
                "challenger": 0.7, "champion": 0.8, "reason": "challenger rmse 0.7000 vs champion 0.8000; shadow: ok",
                "approval": {"approved": True, "by": "ana"}}
    assert decision_text(promoted) == ("Promoted v2 over v1: challenger rmse 0.7000 vs champion 0.8000; shadow: ok; "
                                       "approved by ana")
    # the reason the approver typed is kept with the decision, in the note and on the page's history
    promoted_why = {**promoted, "approval": {"approved": True, "by": "ana", "reason": "the price model changed"}}
    assert decision_text(promoted_why).endswith("; approved by ana: the price model changed")
    assert approval_text(promoted_why["approval"]) == "approved by ana: the price model changed"
    rejected = {**promoted, "action": "kept_champion", "reason": "rejected by ana: wait for the audit",
                "approval": {"approved": False, "by": "ana"}}
    assert decision_text(rejected) == ("Kept champion v1; challenger v2 not promoted: rejected by ana: wait for the "
                                       "audit (test rmse 0.7000 vs 0.8000)")
