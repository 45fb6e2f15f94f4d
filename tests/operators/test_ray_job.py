"""The job-submitting core: end to end with Airflow's dag.test() against a real local Ray cluster, and
its decisions about earlier tries' jobs against the fake Jobs API (tests/operators/fake_jobs_api.py)."""

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
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml_stages.constants import MANIFEST_LOG_MARKER
from tests.conftest import ROOT, load_dag
from tests.operators.fake_jobs_api import Answer
from tests.operators.test_ray_job_follow import _context
from tests.operators.triggers.test_ray import _wait_for_status

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


@pytest.mark.integration
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


def _manifest_log(rows: int) -> str:
    """A generate job's log: its marked manifest line, as the stage writes it."""
    manifest = {"status": "succeeded", "stage": "generate", "rows": rows}
    return f"generating\n{MANIFEST_LOG_MARKER}{json.dumps(manifest)}\n"


@pytest.mark.parametrize(("earlier", "action", "followed"), [
    ({}, "submit", ""),
    ({"": "RUNNING"}, "attach", ""),  # a worker died while its job ran
    ({"": "SUCCEEDED"}, "reuse", ""),  # a retry after the job had succeeded
    ({"": "FAILED"}, "submit", "-r1"),
    ({"": "FAILED", "-r1": "RUNNING"}, "attach", "-r1"),
    ({"": "FAILED", "-r1": "STOPPED"}, "submit", "-r2"),
])
def test_execute_after_earlier_tries_submits_attaches_or_reuses(fake_jobs_api, earlier, action, followed):
    """A try submits a job only when no earlier try's job runs or succeeded; the XCom is that job's manifest."""
    import structlog

    operator = RayJobOperator(task_id="make_data", stage="generate", spec={"rows": 500}, ray_conn_id="ray_fake",
                              deferrable=False, poll_interval_s=0.1)
    context = _context()
    base_id = operator.base_submission_id(context)
    for suffix, status in earlier.items():
        job = fake_jobs_api.add_job(base_id + suffix, status=status, log=_manifest_log(500))
        if status == "RUNNING":  # running when this try looks, ended when it follows it
            fake_jobs_api.script("GET", f"/api/jobs/{base_id + suffix}", Answer(body=job.info()))
            fake_jobs_api.set_status(base_id + suffix, "SUCCEEDED")
    fake_jobs_api.submitted_status, fake_jobs_api.submitted_log = "SUCCEEDED", _manifest_log(500)
    with structlog.testing.capture_logs() as records:
        manifest = operator.execute(context)
    assert manifest == {"status": "succeeded", "stage": "generate", "rows": 500}
    decisions = [r["event"] for r in records if str(r.get("event", "")).startswith(f"Ray job {base_id}")]
    assert decisions[0].startswith(f"Ray job {base_id + followed}: {action};"), decisions
    submitted = [request.json()["submission_id"] for request in fake_jobs_api.seen("POST", "/api/jobs/")]
    assert submitted == ([base_id + followed] if action == "submit" else [])


@pytest.mark.integration
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


@pytest.fixture
def no_gc_callbacks():
    """No garbage-collector callbacks while the test runs. Airflow's execution_timeout raises from a
    SIGALRM handler; a handler that runs while a gc callback does (hypothesis installs one in this
    process once it has run a property test) has its exception ignored, and the task runs on."""
    import gc

    saved = list(gc.callbacks)
    gc.callbacks.clear()
    yield
    gc.callbacks.extend(saved)


@pytest.mark.integration
def test_execution_timeout_stops_the_job(airflow_db, ray_conn, no_gc_callbacks):
    """Airflow stops a task past its execution_timeout and calls on_kill(): the job ends with it."""
    dag_run = _run("core_execution_timeout")
    assert dag_run.state == "failed"
    jobs = _jobs_of(RayHook(), base_submission_id("core_execution_timeout", dag_run.run_id, "make_data"))
    assert jobs, "the task never submitted its job"
    for job in jobs:
        _wait_for_status(job["submission_id"], RayJobStatus.STOPPED, 15)


@pytest.mark.integration
def test_sigterm_to_the_task_process_stops_the_job(airflow_db, fake_jobs_api, monkeypatch, tmp_path):
    """Marking a running task (or its DAG run) failed makes Airflow's supervisor SIGTERM the task
    process, whose handler calls on_kill(): the job is stopped, and the process ends. (A stop that
    really ends a Ray job: test_execution_timeout_stops_the_job.)"""
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", os.environ["AIRFLOW_CONN_RAY_FAKE"])  # the worker's connection
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "wb") as output:
        worker = subprocess.Popen(
            [sys.executable, "-c", "from tests.operators.test_ray_job import _run; _run('core_sigterm')"],
            cwd=ROOT, env=os.environ.copy(), start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
        )
    try:
        deadline, job = time.monotonic() + 120, None
        while job is None or not fake_jobs_api.seen("GET", f"/api/jobs/{job}/logs/tail"):  # submitted and followed
            assert time.monotonic() < deadline and worker.poll() is None, worker_log.read_text()[-3000:]
            time.sleep(0.1)
            job = _submitted_id(fake_jobs_api)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert fake_jobs_api.count("POST", f"/api/jobs/{job}/stop") == 1, worker_log.read_text()[-3000:]
    assert fake_jobs_api.jobs[job].status == "STOPPED" and "Stopping Ray job" in worker_log.read_text()


def _submitted_id(fake) -> str | None:
    submits = fake.seen("POST", "/api/jobs/")
    return submits[0].json()["submission_id"] if submits else None


@pytest.mark.integration
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
