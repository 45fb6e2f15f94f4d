"""RayJobTrigger: what it serialises, and the events it fires for real jobs and real failures."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from operators.hooks.ray import RayHook
from operators.triggers.ray import RayJobTrigger


def test_serialize_is_classpath_and_primitives():
    trigger = RayJobTrigger(submission_id="job-1", ray_conn_id="ray_x", poll_interval_s=0.5, max_unreachable_s=9)
    classpath, kwargs = trigger.serialize()
    assert classpath == "operators.triggers.ray.RayJobTrigger"
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


def _submit(entrypoint: str, submission_id: str) -> str:
    client = RayHook().get_job_client()
    return client.submit_job(entrypoint=entrypoint, submission_id=submission_id)


@pytest.mark.integration
def test_trigger_succeeded_job_fires_success(ray_conn):
    job = _submit("python -c 'print(1)'", f"trigger-ok-{time.time_ns()}")
    event = _first_event(RayJobTrigger(submission_id=job, poll_interval_s=0.2))
    assert event == {"status": "success", "submission_id": job, "job_status": "SUCCEEDED",
                     "message": event["message"]}


@pytest.mark.integration
def test_trigger_failed_job_fires_error_with_status(ray_conn):
    job = _submit("python -c 'raise SystemExit(3)'", f"trigger-fail-{time.time_ns()}")
    event = _first_event(RayJobTrigger(submission_id=job, poll_interval_s=0.2))
    assert event["status"] == "error" and event["job_status"] == "FAILED"
    assert event["submission_id"] == job


@pytest.mark.integration
def test_trigger_unknown_job_fires_error(ray_conn):
    event = _first_event(RayJobTrigger(submission_id="no-such-job", poll_interval_s=0.2))
    assert event["status"] == "error" and "does not exist" in event["message"]


def test_trigger_unreachable_cluster_fires_error_not_crash(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_RAY_GONE", json.dumps(
        {"conn_type": "ray", "extra": {"dashboard_url": f"http://127.0.0.1:{port}"}}))
    trigger = RayJobTrigger(submission_id="x", ray_conn_id="ray_gone", poll_interval_s=0.1, max_unreachable_s=0.3)
    event = _first_event(trigger, timeout_s=30)
    assert event["status"] == "error" and f"127.0.0.1:{port}" in event["message"] and "unreachable" in event["message"]


def test_trigger_bad_connection_fires_error_event(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_BAD", json.dumps({"conn_type": "ray", "extra": {}}))
    event = _first_event(RayJobTrigger(submission_id="x", ray_conn_id="ray_bad"), timeout_s=30)
    assert event["status"] == "error" and "no dashboard URL" in event["message"]
