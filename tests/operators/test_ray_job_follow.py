"""How RayJobOperator follows its job: the log as it is written, deferrable by Airflow's default, and
the job stopped when a deferral times out or the task is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from airflow_ray_ml.errors import RayJobTimeoutError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import RayJobStatus
from airflow_ray_ml.ray_job import RayJobOperator
from tests.conftest import ROOT
from tests.operators.triggers.test_ray import TICKING, _wait_for_status


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
    code = "from airflow_ray_ml.ray_job import RayJobOperator; print(RayJobOperator(task_id='t', stage='generate').deferrable)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting,
             "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == setting


@pytest.mark.integration
def test_wait_logs_each_line_as_the_job_writes_it(ray_conn):
    import structlog

    job = RayHook().submit_job(entrypoint=TICKING, submission_id=f"follow-tick-{time.time_ns()}")
    operator = RayJobOperator(task_id="t", stage="generate")
    with structlog.testing.capture_logs(processors=[structlog.processors.TimeStamper(fmt=None)]) as records:
        offset = operator.wait(job)
    ticks = [r["timestamp"] for r in records if r["event"].startswith("[ray] tick-")]
    assert len(ticks) == 16
    ended_at = RayHook().get_job_info(job)["end_time"] / 1000
    times = [round(ended_at - at, 2) for at in ticks]
    assert times[0] > 3 and times[0] - times[-1] > 3, f"seconds before the job ended: {times}"
    assert offset == len(RayHook().get_job_logs(job))


@pytest.mark.integration
def test_deferral_timeout_stops_the_job(ray_conn, artifact_root):
    """Airflow fails a timed-out deferred task without the trigger's on_kill(); the operator stops the job."""
    from airflow.sdk.bases.operator import TriggerFailureReason
    from airflow.sdk.exceptions import TaskDeferred

    operator = RayJobOperator(task_id="slow", stage="generate", spec={"rows": 400_000, "seed": 3},
                              deferrable=True, job_timeout_s=5)
    context = _context()
    job = operator.base_submission_id(context)
    try:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(context)
        assert deferred.value.timeout == 5  # job_timeout_s bounds the deferral
        # what the task runs when the scheduler found the deferral timed out
        with pytest.raises(RayJobTimeoutError, match=f"{job} did not finish within job_timeout_s=5 s and was stopped"):
            operator.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT.value}, context)
        _wait_for_status(job, RayJobStatus.STOPPED, 15)
    finally:
        RayHook().stop_job(job)


@pytest.mark.integration
def test_on_kill_stops_the_tasks_job(ray_conn, artifact_root):
    from airflow.sdk.exceptions import TaskDeferred

    operator = RayJobOperator(task_id="killed", stage="generate", spec={"rows": 400_000, "seed": 3},
                              deferrable=True)
    context = _context()
    job = operator.base_submission_id(context)
    try:
        with pytest.raises(TaskDeferred):
            operator.execute(context)  # submitted: the task knows its job
        operator.on_kill()
        _wait_for_status(job, RayJobStatus.STOPPED, 15)
    finally:
        RayHook().stop_job(job)


@pytest.mark.integration
def test_job_timeout_stops_the_job_the_worker_follows(ray_conn, artifact_root):
    operator = RayJobOperator(task_id="slow_sync", stage="generate", spec={"rows": 2_000_000, "seed": 3},
                              deferrable=False, job_timeout_s=4, poll_interval_s=0.3)
    context = _context()
    job = operator.base_submission_id(context)
    try:
        with pytest.raises(RayJobTimeoutError, match=f"{job} did not finish within job_timeout_s=4 s and was stopped"):
            operator.execute(context)
        _wait_for_status(job, RayJobStatus.STOPPED, 15)
    finally:
        RayHook().stop_job(job)
