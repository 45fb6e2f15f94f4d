"""How RayJobOperator follows its job: the log as it is written, deferrable by Airflow's default, and
the job stopped when a deferral times out or the task is killed, against the fake Jobs API
(tests/operators/fake_jobs_api.py); test_ray_job.py runs the same behaviours with real jobs."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest

from airflow_ray_ml.errors import RayJobTimeoutError
from airflow_ray_ml.ray_job import RayJobOperator
from tests.child import run_python
from tests.conftest import ROOT


class _TI:
    """The task instance fields the operator reads, and an XCom sink."""

    dag_id = "follow"
    map_index = -1

    def xcom_push(self, key, value):
        pass


def _context() -> dict:
    return {"ti": _TI(), "run_id": f"manual__{time.time_ns()}"}


@pytest.mark.parametrize("setting", ["True", "False"])
def test_deferrable_defaults_to_airflows_default_deferrable(setting):
    code = "from airflow_ray_ml.ray_job import RayJobOperator; report(RayJobOperator(task_id='t', stage='generate').deferrable)"
    child = run_python(code, timeout=120, cwd=ROOT,
                       env={**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting,
                            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])})
    assert child.result is (setting == "True")


def test_wait_logs_each_line_as_the_job_writes_it(fake_jobs_api):
    """The worker's follower logs a line when the stream brings it, not when the job has ended."""
    import threading

    import structlog

    fake_jobs_api.add_job("job-1")
    logged_before_the_next_line: list[bool] = []

    def job() -> None:  # six lines, each written only once the task has logged the one before, then the end
        for number in range(6):
            fake_jobs_api.write_log("job-1", f"tick-{number}\n")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and f"[ray] tick-{number}" not in [r["event"] for r in list(records)]:
                time.sleep(0.05)
            logged_before_the_next_line.append(time.monotonic() < deadline)
        fake_jobs_api.set_status("job-1", "SUCCEEDED")

    writer = threading.Thread(target=job)
    operator = RayJobOperator(task_id="t", stage="generate", ray_conn_id="ray_fake")
    # capture_logs() without arguments: what every structlog the package allows takes
    with structlog.testing.capture_logs() as records:
        writer.start()
        offset = operator.wait("job-1")
    writer.join()
    ticks = [r["event"] for r in records if r["event"].startswith("[ray] tick-")]
    assert ticks == [f"[ray] tick-{number}" for number in range(6)]
    assert logged_before_the_next_line == [True] * 6, "a line reached the task log only after later lines were written"
    assert offset == len(fake_jobs_api.jobs["job-1"].log)


def _submitted_deferrable(fake, task_id: str, **kwargs) -> tuple[RayJobOperator, dict, str]:
    """A deferrable operator that submitted its job to the fake Jobs API and deferred: ``(operator, context, job)``."""
    from airflow_ray_ml.compat import TaskDeferred

    operator = RayJobOperator(task_id=task_id, stage="generate", spec={"rows": 400_000, "seed": 3},
                              ray_conn_id="ray_fake", deferrable=True, **kwargs)
    context = _context()
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    job = operator.base_submission_id(context)
    assert [request.json()["submission_id"] for request in fake.seen("POST", "/api/jobs/")] == [job]
    return operator, context, deferred.value


def test_deferral_timeout_stops_the_job(fake_jobs_api):
    """Airflow fails a timed-out deferred task without the trigger's on_kill(); the operator stops the job."""
    from airflow.sdk.bases.operator import TriggerFailureReason

    operator, context, deferred = _submitted_deferrable(fake_jobs_api, "slow", job_timeout_s=5)
    job = operator.base_submission_id(context)
    # job_timeout_s bounds the deferral (Airflow 3.1 keeps it as a timedelta, 3.2 and newer as seconds)
    timeout = deferred.timeout
    assert (timeout.total_seconds() if isinstance(timeout, timedelta) else timeout) == 5
    # what the task runs when the scheduler found the deferral timed out
    with pytest.raises(RayJobTimeoutError, match=f"{job} did not finish within job_timeout_s=5 s and was stopped"):
        operator.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT.value}, context)
    assert fake_jobs_api.count("POST", f"/api/jobs/{job}/stop") == 1


def test_on_kill_stops_the_tasks_job(fake_jobs_api):
    operator, context, _ = _submitted_deferrable(fake_jobs_api, "killed")  # submitted: the task knows its job
    job = operator.base_submission_id(context)
    operator.on_kill()
    assert fake_jobs_api.count("POST", f"/api/jobs/{job}/stop") == 1 and fake_jobs_api.jobs[job].status == "STOPPED"


def test_job_timeout_stops_the_job_the_worker_follows(fake_jobs_api):
    operator = RayJobOperator(task_id="slow_sync", stage="generate", spec={"rows": 2_000_000, "seed": 3},
                              ray_conn_id="ray_fake", deferrable=False, job_timeout_s=1, poll_interval_s=0.1)
    context = _context()
    job = operator.base_submission_id(context)
    started = time.monotonic()
    with pytest.raises(RayJobTimeoutError, match=f"{job} did not finish within job_timeout_s=1 s and was stopped"):
        operator.execute(context)  # its job runs on, writing nothing
    assert time.monotonic() - started < 10
    assert fake_jobs_api.count("POST", f"/api/jobs/{job}/stop") == 1 and fake_jobs_api.jobs[job].status == "STOPPED"
