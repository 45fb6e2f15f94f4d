"""RayHook's retries of calls that failed transiently, against the fake Jobs API on loopback
(tests/operators/fake_jobs_api.py): the connection ``ray_fake`` keeps the default number of
retries, 10 ms apart, so every test stays well under a second."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_ray_ml import get_provider_info
from airflow_ray_ml.errors import RayClusterUnreachableError, RayConnectionSettingError, RayOperatorError, RayTLSError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.hooks.retry import RetryPolicy
from scripts.localcluster import free_port
from tests.operators.fake_jobs_api import Answer, error


def _declared_default(name: str):
    (connection_type,) = [t for t in get_provider_info()["connection-types"] if name in t["conn-fields"]]
    return connection_type["conn-fields"][name]["schema"]["default"]


def test_retry_settings_unset_take_the_connection_fields_declared_defaults(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_PLAIN", json.dumps(
        {"conn_type": "ray_ml", "extra": {"dashboard_url": "http://127.0.0.1:8265"}}))
    policy = RayHook("ray_plain").retry_policy
    assert policy == RetryPolicy(_declared_default("retries"), _declared_default("retry_max_wait_s"))
    assert policy.tries == policy.retries + 1 > 1  # the default retries
    assert RayHook("ray_plain", retries=0).retry_policy.tries == 1  # a caller that cannot wait


@pytest.mark.parametrize(("extra", "named"), [
    ({"retries": "three"}, "retries must be a whole number"),
    ({"retries": -1}, "retries must be a whole number >= 0, got -1"),
    ({"retries": 1.5}, "retries must be a whole number"),
    ({"retry_max_wait_s": "soon"}, "retry_max_wait_s must be a number"),
])
def test_retry_settings_invalid_fail_at_once_naming_the_field(monkeypatch, extra, named):
    from airflow_ray_ml.compat import AirflowFailException

    monkeypatch.setenv("AIRFLOW_CONN_RAY_BAD", json.dumps(
        {"conn_type": "ray_ml", "extra": {"dashboard_url": "http://127.0.0.1:8265", **extra}}))
    with pytest.raises(RayConnectionSettingError, match=f"'ray_bad': {named}") as caught:
        RayHook("ray_bad").get_version()
    assert isinstance(caught.value, AirflowFailException)  # another try reads the same connection


def test_request_answered_503_twice_then_200_returns_the_third_answer(fake_jobs_api):
    fake_jobs_api.add_job("job-1")
    fake_jobs_api.script("GET", "/api/jobs/job-1", error(503), error(503))
    assert RayHook("ray_fake").get_job_status("job-1").value == "RUNNING"
    assert fake_jobs_api.count("GET", "/api/jobs/job-1") == 3


def test_request_dropped_or_timed_out_is_sent_again(fake_jobs_api):
    fake_jobs_api.script("GET", "/api/version", Answer(drop=True), Answer.recorded("version", delay_s=2))
    assert RayHook("ray_fake", timeout_s=0.5).get_version()["ray_version"]
    assert fake_jobs_api.count("GET", "/api/version") == 3


def test_async_request_answered_503_twice_then_200_returns_the_third_answer(fake_jobs_api):
    fake_jobs_api.add_job("job-1", status="SUCCEEDED")
    fake_jobs_api.script("GET", "/api/jobs/job-1", error(503), error(504))
    assert asyncio.run(RayHook("ray_fake").a_get_job_status("job-1")).value == "SUCCEEDED"
    assert fake_jobs_api.count("GET", "/api/jobs/job-1") == 3


def test_trigger_job_state_answered_503_twice_still_fires_success(fake_jobs_api):
    from airflow_ray_ml.triggers.ray import RayJobTrigger
    from tests.operators.triggers.test_ray import _first_event

    fake_jobs_api.add_job("job-1", status="SUCCEEDED", log="done\n")
    fake_jobs_api.script("GET", "/api/jobs/job-1", error(503), error(503))
    event = _first_event(RayJobTrigger(submission_id="job-1", ray_conn_id="ray_fake", max_unreachable_s=0), 30)
    assert event["status"] == "success" and event["job_status"] == "SUCCEEDED"
    assert fake_jobs_api.count("GET", "/api/jobs/job-1") == 3


def test_non_idempotent_post_answered_503_is_sent_once(fake_jobs_api):
    fake_jobs_api.script("POST", "/api/jobs/job-1/other", error(503), error(503))
    assert RayHook("ray_fake").request("POST", "/api/jobs/job-1/other").status_code == 503  # to its caller
    assert fake_jobs_api.count("POST", "/api/jobs/job-1/other") == 1


def test_submit_answered_503_twice_then_accepted_submits_one_job(fake_jobs_api):
    fake_jobs_api.script("POST", "/api/jobs/", error(503), error(503))
    hook = RayHook("ray_fake")
    assert hook.submit_job(entrypoint="python job.py", submission_id="job-new") == "job-new"
    assert fake_jobs_api.count("POST", "/api/jobs/") == 3 and list(fake_jobs_api.jobs) == ["job-new"]


def test_submit_whose_lost_answer_reached_ray_is_that_job_not_an_error(fake_jobs_api):
    """A proxy timed out (504) while Ray took the submit: the retry hears "already exists", for this very job."""
    fake_jobs_api.script("POST", "/api/jobs/", Answer(status=504, body="gateway timeout", content_type="text/plain",
                                                      forward=True))
    hook = RayHook("ray_fake")
    assert hook.submit_job(entrypoint="python job.py", submission_id="job-new") == "job-new"
    assert fake_jobs_api.count("POST", "/api/jobs/") == 2 and list(fake_jobs_api.jobs) == ["job-new"]
    with pytest.raises(RuntimeError, match="already exists"):  # a first try that hears it: another's job
        hook.submit_job(entrypoint="python job.py", submission_id="job-new")


def test_dashboard_always_503_fails_the_task_once_with_the_url_and_tries(fake_jobs_api):
    from airflow_ray_ml.ray_job import RayJobOperator
    from tests.operators.test_ray_job_follow import _context

    fake_jobs_api.script("GET", "/api/version", *[error(503, "upstream unavailable")] * 50)
    operator = RayJobOperator(task_id="t", entrypoint="python job.py", ray_conn_id="ray_fake", deferrable=False)
    tries = operator.hook.retry_policy.tries
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachableError) as caught:
        operator.execute(_context())
    message = str(caught.value)
    assert message.startswith(f"GET {fake_jobs_api.url}/api/version answered HTTP 503 on {tries} tries")
    assert "upstream unavailable" in message and "'retries'" in message and fake_jobs_api.token not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # one error, not a chain
    assert fake_jobs_api.count("GET", "/api/version") == tries and fake_jobs_api.seen("POST", "/api/jobs/") == []
    assert time.monotonic() - started < 5  # within its budget: 10 ms waits


def test_tls_and_client_errors_are_not_retried(fake_jobs_api):
    fake_jobs_api.script("GET", "/api/jobs/", error(500, "boom"), error(500, "boom"))
    with pytest.raises(RayOperatorError, match="answered HTTP 500"):
        RayHook("ray_fake").list_jobs()
    assert fake_jobs_api.count("GET", "/api/jobs/") == 1
    https = fake_jobs_api.url.replace("http://", "https://")  # a TLS handshake with a plain HTTP server fails
    fake_jobs_api.requests.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_RAY_TLS", json.dumps({"conn_type": "ray_ml", "extra": {
            "dashboard_url": https, "auth_token": fake_jobs_api.token, "retry_max_wait_s": 0.01}}))
        with pytest.raises(RayTLSError, match=r"TLS verification of https://\S+/api/version failed"):  # once, no "N tries"
            RayHook("ray_tls").get_version()
    assert fake_jobs_api.requests == []


def test_exhausted_retries_message_leaves_out_credentials_in_the_url(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_RAY_USERINFO", json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": f"http://admin:s3cret@127.0.0.1:{port}", "retries": 1, "retry_max_wait_s": 0.01}}))
    with pytest.raises(RayClusterUnreachableError) as caught:
        RayHook("ray_userinfo").get_version()
    assert f"at http://127.0.0.1:{port} (ConnectionError on GET /api/version, 2 tries" in str(caught.value)
    assert "s3cret" not in str(caught.value) and "admin" not in str(caught.value)
