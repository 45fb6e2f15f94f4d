"""The job-submitting core, end to end: Airflow's dag.test() against a real local Ray cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import RayJobStatus, base_submission_id
from tests.conftest import ROOT, load_dag
from tests.operators.triggers.test_ray import _wait_for_status

pytestmark = pytest.mark.integration

LOGICAL_DATE = datetime(2026, 3, 1, tzinfo=timezone.utc)


def _run(dag_id: str):
    """Run a test DAG; the fixed logical date and run_after give every call the same run id."""
    return load_dag(dag_id).test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)


def _xcom(dag_run, task_id: str, key: str = "return_value"):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(
            dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, key=key
        ).one()
        value = row.value
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value  # a plain string value
    return value


def _jobs_of(hook: RayHook, base_id: str) -> list[dict]:
    return [job for job in hook.list_jobs() if (job.get("submission_id") or "").startswith(base_id)]


def test_stage_job_in_dag_test_returns_manifest_as_xcom(airflow_db, ray_conn, artifact_root, capfd):
    dag_run = _run("core_manifest")
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "make_data")
    assert manifest["status"] == "succeeded" and manifest["stage"] == "generate"
    assert manifest["rows"] == 500
    assert manifest["artifact_dir"].startswith(artifact_root)
    for uri in manifest["data_uris"]:
        assert os.path.getsize(uri) > 1000
    link = _xcom(dag_run, "make_data", key="ray_job")
    assert link["submission_id"] == base_submission_id("core_manifest", dag_run.run_id, "make_data")
    assert link["job_url"].startswith(ray_conn.dashboard_url)
    # The task log names the job's page as a bare URL, which log viewers link as it is.
    lines = [line for line in capfd.readouterr().out.splitlines() if "; dashboard: " in line]
    assert lines and all(line.split("; dashboard: ", 1)[1].split()[0] == link["job_url"] for line in lines), lines


def test_retry_of_same_task_run_reuses_the_succeeded_job(airflow_db, ray_conn):
    first = _run("core_retry")
    second = _run("core_retry")  # same run id: the task is cleared and runs again, as a retry does
    assert first.run_id == second.run_id and second.state == "success"
    base_id = base_submission_id("core_retry", first.run_id, "make_data")
    assert len(_jobs_of(RayHook(), base_id)) == 1
    assert _xcom(second, "make_data")["fingerprint"]


def test_task_killed_mid_job_then_retried_leaves_one_job(airflow_db, ray_conn, tmp_path):
    """A worker dies while its job runs; the retry attaches to that job instead of submitting one."""
    worker_log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-c", "from tests.operators.test_ray_job import _run; _run('core_kill')"],
        cwd=ROOT, env=os.environ.copy(), start_new_session=True,
        stdout=worker_log, stderr=subprocess.STDOUT,
    )
    hook = RayHook()
    try:
        deadline = time.monotonic() + 120
        jobs: list[dict] = []
        while time.monotonic() < deadline:
            jobs = [j for j in hook.list_jobs() if (j.get("metadata") or {}).get("airflow_dag_id") == "core_kill"]
            if jobs and jobs[0]["status"] in ("PENDING", "RUNNING"):
                break
            time.sleep(0.2)
        assert jobs, "the worker never submitted its job:\n" + (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # no on_kill: the job is left running, as after a crash
        worker.wait()
    killed_id = jobs[0]["submission_id"]

    dag_run = _run("core_kill")
    assert dag_run.state == "success"
    run_jobs = [j for j in hook.list_jobs() if (j.get("metadata") or {}).get("airflow_dag_id") == "core_kill"]
    assert [j["submission_id"] for j in run_jobs] == [killed_id]
    assert _xcom(dag_run, "make_data")["rows"] == 400_000


def test_deferrable_mode_reaches_the_same_manifest_and_logs_the_job_while_deferred(airflow_db, ray_conn):
    import structlog

    with structlog.testing.capture_logs() as records:
        dag_run = _run("core_deferred")
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "make_data")
    assert manifest["status"] == "succeeded" and manifest["rows"] == 500
    base_id = base_submission_id("core_deferred", dag_run.run_id, "make_data")
    jobs = _jobs_of(RayHook(), base_id)
    assert len(jobs) == 1 and RayJobStatus(jobs[0]["status"]) is RayJobStatus.SUCCEEDED
    # The job's lines are logged (by the trigger) after the task paused and before it resumed, once.
    events = [record["event"] for record in records]
    paused = events.index("Pausing task as DEFERRED. ")
    while_deferred = events[paused:events.index("Task started", paused)]
    assert any(e.startswith(f"[ray] Running entrypoint for job {base_id}: python -m airflow_ray_ml_stages.generate") for e in while_deferred)
    manifest_lines = [e for e in events if e.startswith("[ray] RAYML_MANIFEST {")]
    assert len(manifest_lines) == 1 and manifest_lines[0] in while_deferred


def _running_job_of(dag_id: str, timeout_s: float = 120, log_path=None) -> str:
    hook, deadline = RayHook(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = [j for j in hook.list_jobs() if (j.get("metadata") or {}).get("airflow_dag_id") == dag_id
                and j["status"] == "RUNNING"]
        if jobs:
            return jobs[0]["submission_id"]
        time.sleep(0.2)
    raise AssertionError(f"no RUNNING job of {dag_id} within {timeout_s} s" +
                         (":\n" + log_path.read_text()[-3000:] if log_path else ""))


def test_execution_timeout_stops_the_job(airflow_db, ray_conn):
    """Airflow stops a task past its execution_timeout and calls on_kill(): the job ends with it."""
    dag_run = _run("core_execution_timeout")
    assert dag_run.state == "failed"
    jobs = _jobs_of(RayHook(), base_submission_id("core_execution_timeout", dag_run.run_id, "make_data"))
    assert jobs, "the task never submitted its job"
    for job in jobs:
        _wait_for_status(job["submission_id"], RayJobStatus.STOPPED, 15)


def test_sigterm_to_the_task_process_stops_the_job(airflow_db, ray_conn, tmp_path):
    """Marking a running task (or its DAG run) failed makes Airflow's supervisor SIGTERM the task
    process, whose handler calls on_kill(): the job stops, and the process ends."""
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "-c", "from tests.operators.test_ray_job import _run; _run('core_sigterm')"],
            cwd=ROOT, env=os.environ.copy(), start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
        )
    try:
        job = _running_job_of("core_sigterm", log_path=worker_log)
        worker.send_signal(signal.SIGTERM)
        _wait_for_status(job, RayJobStatus.STOPPED, 15)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert "Stopping Ray job" in worker_log.read_text()



def test_airflows_retry_attaches_to_the_job_its_lost_try_left_running(airflow_db, ray_conn):
    """The first try ends while its job runs; Airflow's retry (try 2) follows that job: no second job."""
    import structlog

    with structlog.testing.capture_logs() as records:
        dag_run = _run("core_retry_attaches")
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "success" and ti.try_number == 2
    base_id = base_submission_id("core_retry_attaches", dag_run.run_id, "make_data")
    jobs = _jobs_of(RayHook(), base_id)
    assert [job["submission_id"] for job in jobs] == [base_id] and jobs[0]["status"] == "SUCCEEDED"
    decisions = [r["event"] for r in records if str(r.get("event", "")).startswith(f"Ray job {base_id}: ")]
    assert [d.split(": ")[1].split(";")[0] for d in decisions] == ["submit", "attach"]  # attached while RUNNING
    assert _xcom(dag_run, "make_data")["rows"] == 400_000
