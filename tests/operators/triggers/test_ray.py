"""RayJobTrigger: what it serialises, the events it fires and the log it streams, and what Airflow's
triggerer does to the job when it cancels the trigger.

The branches run against the fake Jobs API (tests/operators/fake_jobs_api.py); real jobs prove the
whole path once each: a job followed to success line by line, and a job stopped when its deferred
task is marked."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

import pytest

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import RayJobStatus
from airflow_ray_ml.triggers.ray import RayJobTrigger
from scripts.localcluster import free_port
from tests.operators.fake_jobs_api import Answer, recorded


def test_serialize_is_classpath_and_primitives():
    trigger = RayJobTrigger(submission_id="job-1", ray_conn_id="ray_x", poll_interval_s=0.5, max_unreachable_s=9)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_ray_ml.triggers.ray.RayJobTrigger"
    assert kwargs == {"submission_id": "job-1", "ray_conn_id": "ray_x", "poll_interval_s": 0.5,
                      "max_unreachable_s": 9}
    assert json.loads(json.dumps(kwargs)) == kwargs
    rebuilt = RayJobTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def _first_event(trigger: RayJobTrigger, timeout_s: float = 120):
    async def first():
        async for event in trigger.run():
            return event.payload
        return None

    return asyncio.run(asyncio.wait_for(first(), timeout_s))


def _event_and_lines(trigger: RayJobTrigger, timeout_s: float = 30) -> tuple[dict, list[str]]:
    """The trigger's event and the job lines it logged."""
    import structlog

    with structlog.testing.capture_logs() as records:
        event = _first_event(trigger, timeout_s)
    return event, [r["event"] for r in records if r["event"].startswith("[ray] ")]


@contextlib.contextmanager
def _job_ends_at_stream(fake_jobs_api, job: str, streams: int):
    """The fake job runs until its log has been asked for ``streams`` times, then succeeds: the
    follower reads the job's state while it streams, so a job that had ended would end it sooner."""
    import threading

    def end() -> None:
        deadline = time.monotonic() + 30
        while fake_jobs_api.count("GET", f"/api/jobs/{job}/logs/tail") < streams and time.monotonic() < deadline:
            time.sleep(0.05)
        fake_jobs_api.set_status(job, "SUCCEEDED")

    ender = threading.Thread(target=end)
    ender.start()
    try:
        yield
    finally:
        ender.join()


def _submit(entrypoint: str, submission_id: str) -> str:
    return RayHook().submit_job(entrypoint=entrypoint, submission_id=submission_id)


@pytest.mark.parametrize("status", ["SUCCEEDED", "FAILED", "STOPPED"])
def test_trigger_ended_job_fires_one_event_with_its_state_and_message(fake_jobs_api, status):
    log = recorded("logs", "job-1")["body"]["logs"]
    fake_jobs_api.add_job("job-1", status=status, log=log)
    event = _first_event(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", poll_interval_s=0.1), 30)
    assert event == {"status": "success" if status == "SUCCEEDED" else "error", "submission_id": "job-1",
                     "job_status": status, "message": recorded(f"job_{status.lower()}", "job-1")["body"]["message"],
                     "log_offset": len(log)}


def test_trigger_unknown_job_fires_error(fake_jobs_api):
    event = _first_event(RayJobTrigger(submission_id="no-such-job", ray_conn_id="ray_fake", poll_interval_s=0.1), 30)
    assert event["status"] == "error" and event["job_status"] is None
    assert f"no-such-job does not exist at {fake_jobs_api.url}" in event["message"]


def test_trigger_follows_a_job_whose_stream_ended_while_it_ran(fake_jobs_api):
    """A stream that closes while the job still runs is opened again, after what was logged."""
    from tests.operators.fake_jobs_api import Stream

    fake_jobs_api.add_job("job-1", log="line-1\nline-2\n")
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs/tail", Stream(["line-1\n"]))
    with _job_ends_at_stream(fake_jobs_api, "job-1", 2):
        event, lines = _event_and_lines(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake",
                                                      poll_interval_s=0.1))
    assert event["status"] == "success" and event["log_offset"] == len("line-1\nline-2\n")
    assert lines == ["[ray] line-1", "[ray] line-2"]  # each once
    assert fake_jobs_api.count("GET", "/api/jobs/job-1/logs/tail") == 2


def test_trigger_rides_out_a_short_outage_and_resumes_the_log(fake_jobs_api):
    from tests.operators.fake_jobs_api import Stream

    fake_jobs_api.add_job("job-1", log="line-1\nline-2\n")
    tail = "/api/jobs/job-1/logs/tail"
    fake_jobs_api.script("GET", tail, Stream(["line-1\nli"], drop=True), Answer(drop=True), Answer(drop=True))
    trigger = RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", poll_interval_s=0.1, max_unreachable_s=30)
    with _job_ends_at_stream(fake_jobs_api, "job-1", 4):
        event, lines = _event_and_lines(trigger)
    assert event["status"] == "success" and lines == ["[ray] line-1", "[ray] line-2"]
    assert fake_jobs_api.count("GET", tail) == 4


def test_trigger_cluster_unreachable_past_its_limit_fires_error(fake_jobs_api):
    fake_jobs_api.add_job("job-1")
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs/tail", *[Answer(drop=True)] * 100)
    trigger = RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", poll_interval_s=0.1, max_unreachable_s=1)
    event = _first_event(trigger, 30)
    assert event["status"] == "error" and "unreachable for 1 s; the job may still be running" in event["message"]
    assert fake_jobs_api.count("GET", "/api/jobs/job-1/logs/tail") > 3  # it kept trying until then


def test_trigger_rejected_token_fires_error_saying_how_to_fix(monkeypatch, fake_jobs_api, tmp_path):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token-here"))
    monkeypatch.setenv("AIRFLOW_CONN_RAY_NOTOKEN", json.dumps({"conn_type": "ray_ml", "extra": {"dashboard_url": fake_jobs_api.url}}))
    fake_jobs_api.add_job("job-1")
    event = _first_event(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_notoken"), 30)
    assert event["status"] == "error" and event["message"].startswith("RayAuthError: ")
    assert "HTTP 401" in event["message"] and "RAY_AUTH_TOKEN" in event["message"]


@pytest.mark.parametrize("answer", [
    Answer(body="<html>upstream error</html>", content_type="text/html"),  # a proxy's page, not JSON
    Answer(body={"status": "NOT_A_STATE"}),
])
def test_trigger_malformed_job_answer_fires_error_not_crash(fake_jobs_api, answer):
    fake_jobs_api.add_job("job-1", status="SUCCEEDED")
    fake_jobs_api.script("GET", "/api/jobs/job-1", answer)
    event = _first_event(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake"), 30)
    assert event["status"] == "error" and event["submission_id"] == "job-1"
    assert event["message"].split(":")[0] in ("JSONDecodeError", "ValueError")


def test_trigger_unreachable_cluster_fires_error_not_crash(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_RAY_GONE", json.dumps(
        {"conn_type": "ray_ml", "extra": {"dashboard_url": f"http://127.0.0.1:{port}"}}))
    trigger = RayJobTrigger(submission_id="x", ray_conn_id="ray_gone", poll_interval_s=0.1, max_unreachable_s=0.3)
    event = _first_event(trigger, timeout_s=30)
    assert event["status"] == "error" and f"127.0.0.1:{port}" in event["message"] and "unreachable" in event["message"]


def test_trigger_bad_connection_fires_error_event(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_BAD", json.dumps({"conn_type": "ray_ml", "extra": {}}))
    event = _first_event(RayJobTrigger(submission_id="x", ray_conn_id="ray_bad"), timeout_s=30)
    assert event["status"] == "error" and "no dashboard URL" in event["message"]


# A job that writes one line every half second for eight seconds.
TICKING = "python -c \"import time\nfor i in range(16):\n    print(f'tick-{i}', flush=True)\n    time.sleep(0.5)\""
SLEEPING = "python -c \"import time\nprint('started', flush=True)\ntime.sleep(600)\""


def _wait_for_status(job: str, wanted: RayJobStatus, timeout_s: float) -> None:
    hook, started = RayHook(), time.monotonic()
    while (status := hook.get_job_status(job)) is not wanted:
        assert time.monotonic() - started < timeout_s, f"job {job} is {status}, not {wanted}, after {timeout_s:.1f} s"
        time.sleep(0.2)


@pytest.mark.integration
def test_trigger_logs_each_job_line_while_the_job_runs(ray_conn):
    """What the trigger logs reaches the deferred task's log: each line comes as the job writes it."""
    import structlog

    job = _submit(TICKING, f"trigger-tick-{time.time_ns()}")
    with structlog.testing.capture_logs(processors=[structlog.processors.TimeStamper(fmt=None)]) as records:
        event = _first_event(RayJobTrigger(submission_id=job, poll_interval_s=0.2))
    assert event["status"] == "success"
    ticks = [(r["event"], r["timestamp"]) for r in records if r["event"].startswith("[ray] tick-")]
    assert [line for line, _ in ticks] == [f"[ray] tick-{i}" for i in range(16)]
    ended_at = RayHook().get_job_info(job)["end_time"] / 1000
    # Ray sends what the job wrote about once a second: tick-0, written 7.5 s before the job ends,
    # is logged well before it, and the ticks are logged over seconds, not all at the end.
    times = [round(ended_at - at, 2) for _, at in ticks]
    assert times[0] > 3 and times[0] - times[-1] > 3, f"seconds before the job ended: {times}"
    assert event["log_offset"] == len(RayHook().get_job_logs(job))


async def _run_in_triggerer(trigger: RayJobTrigger, *, cancel: str, timeout_after=None, settle_s: float = 3) -> float:
    """Run the trigger under Airflow's own TriggerRunner until it follows the job, then cancel it the way
    the triggerer does: "user" (the task was marked failed/success or cleared), "shutdown" (the
    triggerer stops or restarts), or "timeout" (its deferral timed out: ``timeout_after`` has passed).
    ``settle_s``: seconds until it follows the job's log. Returns when it was cancelled (``time.monotonic()``)."""
    import inspect

    from airflow.jobs.triggerer_job_runner import TriggerRunner

    runner = TriggerRunner()
    trigger.task_instance = getattr(trigger, "task_instance", None)
    runner.triggers[1] = {"task": None, "name": repr(trigger), "events": 0}
    if "timeout_after" in inspect.signature(runner.run_trigger).parameters:
        task = asyncio.create_task(runner.run_trigger(1, trigger, timeout_after=timeout_after))
    else:  # Airflow 3.1 reads the deferral's timeout from the trigger
        trigger.timeout_after = timeout_after
        task = asyncio.create_task(runner.run_trigger(1, trigger))
    runner.triggers[1]["task"] = task
    await asyncio.sleep(settle_s)  # connected to the job's log by now
    assert not task.done()
    cancelled_at = time.monotonic()
    if cancel == "shutdown":
        task.cancel()
    else:  # the scheduler removed the trigger: the triggerer cancels it as after a user's action
        runner.to_cancel.append(1)
        await runner.cancel_triggers()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return cancelled_at


def test_triggerer_restart_and_cleanup_leave_the_job_running(fake_jobs_api):
    fake_jobs_api.add_job("job-1", log="started\n")
    asyncio.run(_run_in_triggerer(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", poll_interval_s=0.1),
                                  cancel="shutdown", settle_s=0.5))
    asyncio.run(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake").cleanup())  # on every exit
    assert fake_jobs_api.count("GET", "/api/jobs/job-1/logs/tail") == 1  # it followed the job
    assert fake_jobs_api.count("POST", "/api/jobs/job-1/stop") == 0 and fake_jobs_api.jobs["job-1"].status == "RUNNING"


@pytest.mark.integration
def test_marking_the_deferred_task_stops_its_job_within_15_s(ray_conn):
    job = _submit(SLEEPING, f"trigger-kill-{time.time_ns()}")
    try:
        _wait_for_status(job, RayJobStatus.RUNNING, 120)
        cancelled_at = asyncio.run(
            _run_in_triggerer(RayJobTrigger(submission_id=job, poll_interval_s=0.2), cancel="user"))
        _wait_for_status(job, RayJobStatus.STOPPED, 15 - (time.monotonic() - cancelled_at))
    finally:
        RayHook().stop_job(job)


def test_timed_out_trigger_is_not_killed_by_the_triggerer(fake_jobs_api):
    """Airflow cancels a timed-out trigger without on_kill(): RayJobOperator stops the job (test_ray_job_follow)."""
    from datetime import datetime, timedelta, timezone

    fake_jobs_api.add_job("job-1", log="started\n")
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    asyncio.run(_run_in_triggerer(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", poll_interval_s=0.1),
                                  cancel="timeout", timeout_after=past, settle_s=0.5))
    assert fake_jobs_api.count("POST", "/api/jobs/job-1/stop") == 0 and fake_jobs_api.jobs["job-1"].status == "RUNNING"


def _set_state(ti, state: str) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(TaskInstance).filter_by(id=ti.id).update({"state": state})


@contextlib.contextmanager
def _task_api_of(trigger: RayJobTrigger):
    """Airflow's task API at hand for ``trigger``'s task instance, as in a triggerer (here: in process,
    on the test DB)."""
    import psutil
    import structlog

    from airflow.sdk.execution_time.supervisor import (
        InProcessSupervisorComms, InProcessTestSupervisor, set_supervisor_comms,
    )

    supervisor = InProcessTestSupervisor(
        id=trigger.task_instance.id, pid=os.getpid(), process=psutil.Process(),
        process_log=structlog.get_logger(logger_name="task").bind(), client=InProcessTestSupervisor._api_client(),
    )
    supervisor.comms = InProcessSupervisorComms(supervisor=supervisor)
    with set_supervisor_comms(supervisor.comms):
        yield


def _on_kill_in_triggerer(trigger: RayJobTrigger) -> None:
    """Call on_kill() as a triggerer does."""
    with _task_api_of(trigger):
        asyncio.run(trigger.on_kill())


def _trigger_of_a_task_instance(fake) -> tuple:
    """A task instance in the metadata DB (a core_noop run) and a trigger of its own following a
    running job of the fake Jobs API, as a triggerer holds it: ``(dag_run, ti, trigger)``."""
    from airflow.sdk.api.datamodels._generated import TaskInstance as TaskInstanceSDK

    from tests.conftest import load_dag

    dag_run = load_dag("core_noop").test()
    (ti,) = dag_run.get_task_instances()
    job = fake.add_job(f"job-{time.time_ns()}", log="started\n")
    trigger = RayJobTrigger(submission_id=job.submission_id, ray_conn_id="ray_fake")
    trigger.task_instance = TaskInstanceSDK(id=ti.id, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id,
                                            try_number=ti.try_number, map_index=ti.map_index,
                                            dag_version_id=ti.dag_version_id)
    return dag_run, ti, trigger


@pytest.mark.integration
def test_trigger_taken_over_by_another_triggerer_leaves_the_job_running(airflow_db, fake_jobs_api):
    """Airflow 3.3 cancels a trigger that another triggerer took over as after a user's action. on_kill()
    then finds the task still deferred and leaves the job; once the task is marked failed, it stops it."""
    _, ti, trigger = _trigger_of_a_task_instance(fake_jobs_api)
    stop = f"/api/jobs/{trigger.submission_id}/stop"
    _set_state(ti, "deferred")
    _on_kill_in_triggerer(trigger)
    assert fake_jobs_api.count("POST", stop) == 0
    _set_state(ti, "failed")
    _on_kill_in_triggerer(trigger)
    assert fake_jobs_api.count("POST", stop) == 1 and fake_jobs_api.jobs[trigger.submission_id].status == "STOPPED"


@pytest.mark.integration
def test_marking_the_dag_run_failed_stops_the_deferred_tasks_job(airflow_db, fake_jobs_api):
    """Marking a DAG run failed marks its deferred tasks failed; their triggers' on_kill() stops the jobs."""
    from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    dag_run, ti, trigger = _trigger_of_a_task_instance(fake_jobs_api)
    _set_state(ti, "deferred")
    with create_session() as session:
        dag = SerializedDagModel.get_dag("core_noop", session=session)
        _, killed = set_dag_run_state_to_failed(dag=dag, run_id=dag_run.run_id, commit=True, session=session)
    assert [killed_ti.task_id for killed_ti in killed] == ["noop"]
    _on_kill_in_triggerer(trigger)  # what the triggerer does for a trigger whose task is no longer deferred
    assert fake_jobs_api.count("POST", f"/api/jobs/{trigger.submission_id}/stop") == 1
    assert fake_jobs_api.jobs[trigger.submission_id].status == "STOPPED"


@pytest.mark.integration
@pytest.mark.lowest
@pytest.mark.parametrize(("state", "cancel", "stopped"), [
    ("failed", "user", True),        # a user marked the deferred task failed
    ("deferred", "shutdown", False),  # the triggerer stops or restarts
    ("deferred", "user", False),      # Airflow 3.3: another triggerer took the trigger over
])
def test_triggerer_cancelling_a_tasks_trigger_stops_the_job_only_once_the_task_left_deferred(
        airflow_db, fake_jobs_api, state, cancel, stopped):
    """Through the triggerer's own run and cancel of the trigger: Airflow 3.3 calls on_kill(), an older
    triggerer only cleanup(); on either, the job of a task marked failed stops and that of a task still
    deferred goes on."""
    _, ti, trigger = _trigger_of_a_task_instance(fake_jobs_api)
    _set_state(ti, state)
    with _task_api_of(trigger):
        asyncio.run(_run_in_triggerer(trigger, cancel=cancel, settle_s=0.5))
    job = fake_jobs_api.jobs[trigger.submission_id]
    assert fake_jobs_api.count("POST", f"/api/jobs/{trigger.submission_id}/stop") == int(stopped)
    assert job.status == ("STOPPED" if stopped else "RUNNING")
