"""RayHook: URL and token resolution, and clear errors, against the fake Jobs API that answers as Ray does
(tests/operators/fake_jobs_api.py). Real jobs go through the hook in every integration test."""

from __future__ import annotations

import json
import os
import re

import pytest
import structlog

from airflow_ray_ml.errors import RayAuthError, RayClusterUnreachableError, RayOperatorError
from airflow_ray_ml.hooks.ray import RayHook, normalise_dashboard_url, resolve_token
from scripts.localcluster import free_port
from tests.conftest import AIRFLOW_BEFORE_3_2
from tests.operators.fake_jobs_api import recorded


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("http://127.0.0.1:8265", None, "http://127.0.0.1:8265"),
        ("127.0.0.1", None, "http://127.0.0.1:8265"),
        ("ray-head", 9000, "http://ray-head:9000"),
        ("https://ray.example.com/", None, "https://ray.example.com:8265"),
        ("https://ray.example.com:443", None, "https://ray.example.com:443"),
    ],
)
def test_normalise_dashboard_url_forms_resolve(host, port, expected):
    assert normalise_dashboard_url(host, port) == expected


def test_normalise_dashboard_url_bad_scheme_names_it():
    with pytest.raises(RayOperatorError, match="ray://head:10001.*http:// or https://"):
        normalise_dashboard_url("ray://head:10001")


def test_resolve_token_connection_first(tmp_path):
    token_file = tmp_path / "auth_token"
    token_file.write_text("from-file\n")
    env = {"RAY_AUTH_TOKEN": "from-env"}
    assert resolve_token("from-conn", env, token_file) == "from-conn"
    assert resolve_token(None, env, token_file) == "from-env"
    assert resolve_token("  ", {}, token_file) == "from-file"
    assert resolve_token(None, {}, tmp_path / "missing") is None


def test_resolve_token_path_env_overrides_default_file(tmp_path):
    custom = tmp_path / "custom"
    custom.write_text("custom-token")
    assert resolve_token(None, {"RAY_AUTH_TOKEN_PATH": str(custom)}, tmp_path / "other") == "custom-token"


def _set_conn(monkeypatch, conn_id: str, **extra):
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "ray_ml", "extra": extra}))


def test_hook_reads_connection_fields(monkeypatch):
    _set_conn(monkeypatch, "ray_x", dashboard_url="http://10.0.0.5:8265", auth_token="tok",
              verify_tls="false", artifact_root="s3://bucket/ml")
    hook = RayHook("ray_x")
    assert hook.dashboard_url == "http://10.0.0.5:8265"
    assert hook.auth_headers() == {"Authorization": "Bearer tok"}
    assert hook.verify_tls is False
    assert hook.artifact_root == "s3://bucket/ml"


def test_hook_verify_tls_defaults_on(monkeypatch):
    _set_conn(monkeypatch, "ray_y", dashboard_url="https://ray.example.com")
    assert RayHook("ray_y").verify_tls is True


def test_hook_without_url_says_which_field(monkeypatch):
    _set_conn(monkeypatch, "ray_z")
    with pytest.raises(RayOperatorError, match="'ray_z' has no dashboard URL.*dashboard_url"):
        RayHook("ray_z").dashboard_url


def test_connection_type_ray_ml_gets_the_ray_hook_from_airflow(monkeypatch):
    from airflow.models.connection import Connection

    _set_conn(monkeypatch, "ray_typed", dashboard_url="http://10.0.0.7:8265")
    hook = Connection(conn_id="ray_typed", conn_type="ray_ml").get_hook()  # what Airflow's test button does
    assert isinstance(hook, RayHook) and hook.ray_conn_id == "ray_typed"
    assert hook.dashboard_url == "http://10.0.0.7:8265"


def test_hook_connection_of_the_old_ray_type_is_read_with_a_warning(monkeypatch):
    extra = {"dashboard_url": "http://10.0.0.6:8265", "auth_token": "tok"}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_OLD", json.dumps({"conn_type": "ray", "extra": extra}))
    _set_conn(monkeypatch, "ray_new", **extra)

    def type_warnings(records: list[dict]) -> list[str]:
        return [r["event"] for r in records if "change it to" in str(r.get("event"))]

    with structlog.testing.capture_logs() as records:
        assert RayHook("ray_new").dashboard_url == "http://10.0.0.6:8265"
    assert type_warnings(records) == []
    with structlog.testing.capture_logs() as records:
        old = RayHook("ray_old")
        assert old.dashboard_url == "http://10.0.0.6:8265"
        assert old.auth_headers() == {"Authorization": "Bearer tok"}
    (warning,) = type_warnings(records)
    assert "'ray_old' has type 'ray'; change it to 'ray_ml'" in warning and "tok" not in warning


def test_hook_default_connection_missing_uses_local_cluster(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT", raising=False)
    monkeypatch.setenv("RAY_DASHBOARD_URL", "http://127.0.0.1:18265")
    assert RayHook().dashboard_url == "http://127.0.0.1:18265"


def test_hook_unreachable_cluster_one_clear_sentence(monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    _set_conn(monkeypatch, "ray_down", dashboard_url=url, retries=1, retry_max_wait_s=0.01)
    hook = RayHook("ray_down", timeout_s=2)
    with pytest.raises(RayClusterUnreachableError) as caught:
        hook.check_access()
    message = str(caught.value)
    assert url in message and "make run" in message and "'ray_down'" in message
    # the tries' seconds are measured (about 0 here, more on a loaded machine), the rest is fixed
    assert re.search(r"\(ConnectionError on GET /api/version, 2 tries in \d+ s\)", message), message
    assert caught.value.__cause__ is None and "Traceback" not in message
    ok, text = hook.test_connection()
    assert ok is False and url in text


def _fake_conn(monkeypatch, fake, conn_id: str, **extra):
    _set_conn(monkeypatch, conn_id, dashboard_url=fake.url, **extra)


def test_hook_test_connection_answering_cluster_names_its_version(fake_jobs_api):
    ok, text = RayHook("ray_fake").test_connection()
    assert ok, text
    assert f"Ray {recorded('version')['body']['ray_version']} at {fake_jobs_api.url}" in text
    assert fake_jobs_api.count("GET", "/api/jobs/") == 1  # the Jobs API answered too, not only the version
    assert {request.authorization for request in fake_jobs_api.requests} == {f"Bearer {fake_jobs_api.token}"}


def test_hook_missing_or_wrong_token_says_how_to_fix(monkeypatch, fake_jobs_api, tmp_path):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token-here"))
    _fake_conn(monkeypatch, fake_jobs_api, "ray_notoken")
    with pytest.raises(RayAuthError, match="HTTP 401.*RAY_AUTH_TOKEN"):
        RayHook("ray_notoken").check_access()
    ok, text = RayHook("ray_notoken").test_connection()
    assert ok is False and "HTTP 401" in text
    _fake_conn(monkeypatch, fake_jobs_api, "ray_badtoken", auth_token="wrong")
    with pytest.raises(RayAuthError, match="HTTP 403"):
        RayHook("ray_badtoken").check_access()


def test_hook_async_calls_and_log_tail_without_token_say_how_to_fix(monkeypatch, fake_jobs_api, tmp_path):
    import asyncio

    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token-here"))
    _fake_conn(monkeypatch, fake_jobs_api, "ray_notoken")
    fake_jobs_api.add_job("job-1")
    with pytest.raises(RayAuthError, match="HTTP 401.*'ray_notoken'"):
        asyncio.run(RayHook("ray_notoken").a_get_job_info("job-1"))
    with pytest.raises(RayAuthError, match="HTTP 401.*'ray_notoken'"):
        list(RayHook("ray_notoken").tail_job_logs("job-1", timeout_s=10))


def test_hook_cluster_resources_map_the_state_apis_nodes(fake_jobs_api):
    (node,) = recorded("nodes")["body"]["data"]["result"]["result"]
    resources = RayHook("ray_fake").get_cluster_resources()
    assert resources == {node["node_id"]: {"total": node["resources_total"], "state": "ALIVE",
                                           "address": node["node_ip"], "labels": node["labels"]}}
    (request,) = fake_jobs_api.seen("GET", "/api/v0/nodes")
    assert request.query == {"detail": "1", "limit": "1000"}


def test_hook_slow_dashboard_times_out_as_unreachable(fake_jobs_api):
    import asyncio

    from tests.operators.fake_jobs_api import Answer

    fake_jobs_api.script("GET", "/api/version", Answer.recorded("version", delay_s=3),
                         Answer.recorded("version", delay_s=3))
    hook = RayHook("ray_fake", timeout_s=0.5, retries=0)
    with pytest.raises(RayClusterUnreachableError, match=f"{fake_jobs_api.url} \\(ReadTimeout on GET /api/version, 1 try.*make run"):
        hook.get_version()
    with pytest.raises(RayClusterUnreachableError, match=f"{fake_jobs_api.url} \\(ReadTimeout on GET /api/version, 1 try"):
        asyncio.run(hook.a_get_version())


def test_hook_dashboard_dying_mid_request_is_unreachable(fake_jobs_api):
    from tests.operators.fake_jobs_api import Answer

    fake_jobs_api.add_job("job-1")
    fake_jobs_api.script("GET", "/api/jobs/job-1", Answer(drop=True))
    with pytest.raises(RayClusterUnreachableError, match="Cannot reach the Ray cluster"):
        RayHook("ray_fake", retries=0).get_job_status("job-1")
    assert RayHook("ray_fake").get_job_status("job-1").value == "RUNNING"  # the next answer is the job's


def test_hook_error_answers_name_the_call_status_and_body(fake_jobs_api):
    from tests.operators.fake_jobs_api import error

    fake_jobs_api.add_job("job-1")
    traceback = "Traceback (most recent call last):\n" + "".join(f"  frame {i}\n" for i in range(20)) + "KeyError: 'x'\n"
    # 500s: a 502, 503 or 504 is retried (tests/operators/hooks/test_retry.py)
    fake_jobs_api.script("GET", "/api/jobs/job-1", error(500, "overloaded"))
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs", error(500, traceback))
    fake_jobs_api.script("POST", "/api/jobs/job-1/stop", error(500, "stop failed"))
    fake_jobs_api.script("GET", "/api/v0/nodes", error(500, "state api down"))
    hook = RayHook("ray_fake")
    with pytest.raises(RayOperatorError, match="answered HTTP 500 for job job-1: overloaded"):
        hook.get_job_info("job-1")
    with pytest.raises(RayOperatorError, match="(?s)did not return the log of job job-1 \\(HTTP 500: .*KeyError: 'x'\\)") as caught:
        hook.get_job_logs("job-1")
    assert "frame 3" not in str(caught.value)  # the traceback's end, not all of it
    with pytest.raises(RayOperatorError, match="did not stop job job-1 \\(HTTP 500: stop failed\\)"):
        hook.stop_job("job-1")
    with pytest.raises(RayOperatorError, match=f"GET {fake_jobs_api.url}/api/v0/nodes answered HTTP 500: state api down"):
        hook.get_nodes()


def test_hook_dashboard_without_jobs_api_says_so(fake_jobs_api):
    from tests.operators.fake_jobs_api import error

    fake_jobs_api.script("GET", "/api/jobs/", error(404, "Not Found"))
    with pytest.raises(RayOperatorError, match="answered HTTP 404; is this a Ray dashboard with the job module"):
        RayHook("ray_fake").check_access()


def test_hook_unknown_job_is_none_empty_and_not_stopped(fake_jobs_api):
    import asyncio

    hook = RayHook("ray_fake")
    assert hook.get_job_info("no-such-job") is None and hook.get_job_status("no-such-job") is None
    assert hook.get_job_logs("no-such-job") == "" and hook.stop_job("no-such-job") is False

    async def async_answers():
        twin = RayHook("ray_fake")
        return (await twin.a_get_job_status("no-such-job"), await twin.a_get_job_logs("no-such-job"),
                await twin.a_stop_job("no-such-job"))

    assert asyncio.run(async_answers()) == (None, "", False)
    assert recorded("job_unknown")["status"] == 404 == recorded("stop_unknown")["status"]  # Ray's own answers
    with pytest.raises(RayOperatorError, match="no-such-job does not exist"):
        list(hook.tail_job_logs("no-such-job"))


def test_hook_submits_through_rays_client_with_the_header(fake_jobs_api):
    hook = RayHook("ray_fake")
    job = hook.submit_job(entrypoint="python job.py", submission_id="job-new", metadata={"a": "1"},
                          entrypoint_num_cpus=1)
    assert job == "job-new" and hook.get_job_status(job).value == "RUNNING"
    (submit,) = fake_jobs_api.seen("POST", "/api/jobs/")
    assert submit.json()["entrypoint_num_cpus"] == 1 and submit.authorization == f"Bearer {fake_jobs_api.token}"
    with pytest.raises(RuntimeError, match="already exists"):  # Ray's answer, which RayJobOperator attaches on
        hook.submit_job(entrypoint="python job.py", submission_id="job-new")


@pytest.mark.skipif(AIRFLOW_BEFORE_3_2, reason="Airflow 3.1's own log set-up writes the standard library's "
                    "records to stderr (3.2 and newer: stdout), the Ray client's among them: a known 3.1 limitation")
def test_ray_client_info_lines_reach_the_task_log_at_info_not_stderr(fake_jobs_api, tmp_path):
    """Airflow records a task's stderr at error level: the Ray client's INFO lines must not go there."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text("print('hello')\n")
    script = (
        "from airflow_ray_ml.hooks.ray import RayHook\n"
        "client = RayHook('ray_fake').get_job_client()\n"
        f"client.submit_job(entrypoint='python job.py', runtime_env={{'working_dir': {str(tmp_path / 'code')!r}}})\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])})
    assert result.returncode == 0, result.stderr
    assert [request.method for request in fake_jobs_api.requests if request.path.startswith("/api/packages/")] == ["GET", "PUT"]
    # Airflow's own log set-up (what a task's records go through) shows the record at its level
    uploads = [line for line in result.stdout.splitlines() if "Uploading package" in line]
    assert uploads and all("info" in line.lower() and "dashboard_sdk" in line for line in uploads), result.stdout
    assert "Uploading package" not in result.stderr, result.stderr


def test_operators_and_trigger_build_no_dashboard_api_urls():
    """Every dashboard route lives in the hook (operators/hooks/); the UI links build page URLs, not /api/ ones.
    Airflow's own REST API (``/api/v2/``, which the api-server middleware of plugins/known_params.py
    guards) is not the dashboard's."""
    from tests.conftest import ROOT

    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "operators").rglob("*.py")) if "hooks" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "/api/" in line.replace("/api/v2/", "")
    ]
    assert offenders == []


def test_async_twins_answer_like_the_sync_calls(fake_jobs_api):
    import asyncio

    log = recorded("logs", "job-1")["body"]["logs"]  # Ray's log of a job whose last line has no line end
    fake_jobs_api.add_job("job-1", status="SUCCEEDED", log=log)
    hook = RayHook("ray_fake")
    lines = list(hook.tail_job_logs("job-1", timeout_s=30))  # ends once the job has ended

    async def async_answers():
        twin = RayHook("ray_fake")
        return {
            "version": await twin.a_get_version(),
            "info": await twin.a_get_job_info("job-1"),
            "status": await twin.a_get_job_status("job-1"),
            "missing": await twin.a_get_job_status("no-such-job"),
            "logs": await twin.a_get_job_logs("job-1"),
            "tail": [line async for line in twin.a_tail_job_logs("job-1")],
            "tail_from": [line async for line in twin.a_tail_job_logs("job-1", offset=len(lines[0]) + 3)],
            "jobs": await twin.a_list_jobs(),
            "nodes": await twin.a_get_nodes(),
            "serve": await twin.a_get_serve_applications(),
            "stop": await twin.a_stop_job("job-1"),
        }

    answers = asyncio.run(async_answers())
    assert answers["version"] == hook.get_version()
    assert answers["info"] == hook.get_job_info("job-1") and answers["status"] is hook.get_job_status("job-1")
    assert answers["status"].value == "SUCCEEDED" and answers["missing"] is None
    assert answers["logs"] == hook.get_job_logs("job-1") == log == "".join(lines) == "".join(answers["tail"])
    assert lines[-1][-1:] != "\n" and all(line.endswith("\n") for line in lines[:-1])
    assert "".join(answers["tail_from"]) == log[len(lines[0]) + 3:]
    assert [j["submission_id"] for j in answers["jobs"]] == ["job-1"] == [j["submission_id"] for j in hook.list_jobs()]
    assert [n["node_id"] for n in answers["nodes"]] == [n["node_id"] for n in hook.get_nodes()]
    assert answers["serve"].keys() == hook.get_serve_applications().keys()
    assert answers["stop"] is False is hook.stop_job("job-1")  # it had ended


def test_tail_skips_its_offset_across_messages_that_split_lines(fake_jobs_api):
    from tests.operators.fake_jobs_api import Stream

    fake_jobs_api.add_job("job-1", status="SUCCEEDED")
    path = "/api/jobs/job-1/logs/tail"
    fake_jobs_api.script("GET", path, Stream(["li", "ne-1\nline-2\nli", "ne-3"]), Stream(["li", "ne-1\nline-2\nli", "ne-3"]))
    hook = RayHook("ray_fake")
    assert list(hook.tail_job_logs("job-1")) == ["line-1\n", "line-2\n", "line-3"]
    assert list(hook.tail_job_logs("job-1", offset=len("line-1\nli"))) == ["ne-2\n", "line-3"]


def test_tail_ends_within_its_status_poll_of_the_jobs_end_while_rays_stream_stays_open(fake_jobs_api):
    import time

    from tests.operators.fake_jobs_api import Stream

    # Ray closes a tail seconds after the job ended; until then its stream may have sent only part of the log
    fake_jobs_api.add_job("job-1", status="SUCCEEDED", log="line-1\nline-2\nlast")
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs/tail", Stream(["line-1\n"], close_code=None))
    started = time.monotonic()
    lines = list(RayHook("ray_fake").tail_job_logs("job-1", timeout_s=30, status_poll_s=0.2))
    assert lines == ["line-1\n", "line-2\n", "last"]  # the rest from the whole log, each character once
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("stream", "reason"), [
    ({"close_code": 1011}, "websocket close code 1011"),
    ({"drop": True}, "dropped before the job ended|Cannot reach"),
])
def test_tail_stream_ending_abnormally_is_unreachable_after_its_lines(fake_jobs_api, stream, reason):
    from tests.operators.fake_jobs_api import Stream

    fake_jobs_api.add_job("job-1")
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs/tail", Stream(["line-1\n"], **stream))
    got = []
    with pytest.raises(RayClusterUnreachableError, match=reason):
        for line in RayHook("ray_fake").tail_job_logs("job-1", timeout_s=10):
            got.append(line)
    assert got == ["line-1\n"]


def test_tail_refused_with_another_status_names_it(fake_jobs_api):
    from tests.operators.fake_jobs_api import error

    fake_jobs_api.add_job("job-1")
    fake_jobs_api.script("GET", "/api/jobs/job-1/logs/tail", error(502, "bad gateway"))
    # a proxy's 502: unreachable, so the follower reconnects (RayJobOperator.wait, RayJobTrigger.run)
    with pytest.raises(RayClusterUnreachableError, match=r"/api/jobs/job-1/logs/tail \(websocket\) answered HTTP 502"):
        list(RayHook("ray_fake").tail_job_logs("job-1"))


class _Alarm(BaseException):
    """Raised by a signal handler, as Airflow's execution_timeout raises AirflowTaskTimeout (a BaseException)."""


def test_a_signals_exception_always_reaches_the_follower_of_a_busy_log(fake_jobs_api):
    """Airflow stops a task past its execution_timeout by raising from a SIGALRM handler. Each alarm
    here, at a random moment while lines pour in, must end the follow at once: never be lost inside
    the stream's reading (which would follow the job to its end, or hang), never need a second one."""
    import random
    import signal

    from tests.operators.fake_jobs_api import Stream

    def alarm(signum, frame):
        nonlocal delivered
        delivered += 1
        # a lost alarm shows as a second one, 5 s later; on a loaded machine the follow's unwinding
        # (closing a stream of 28 MB) took over half a second, and a second alarm every 0.5 s came
        # during it though the first had ended the follow
        signal.setitimer(signal.ITIMER_REAL, 5.0, 5.0)
        raise _Alarm()

    hook, delivered, outcomes = RayHook("ray_fake"), 0, []
    long_lines = [f"line {n} " * 4000 + "\n" for n in range(1000)]
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for trial in range(25):
            job = f"job-{trial}"
            fake_jobs_api.add_job(job)  # RUNNING: its stream stays open after these long lines
            fake_jobs_api.script("GET", f"/api/jobs/{job}/logs/tail", Stream(long_lines, close_code=None))
            delivered = 0
            # the first alarm at a random moment; should it be lost, more follow (every 0.5 s until one
            # is delivered, then every 5 s)
            signal.setitimer(signal.ITIMER_REAL, random.uniform(0.02, 0.1), 0.5)
            try:
                for _ in hook.tail_job_logs(job, timeout_s=20):
                    pass
                outcomes.append("followed to the end")
            except _Alarm:
                outcomes.append(f"stopped by alarm {delivered}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert set(outcomes) == {"stopped by alarm 1"}, outcomes


def test_tail_gives_up_after_its_timeout_and_stop_ends_the_job(fake_jobs_api):
    import time

    fake_jobs_api.add_job("job-1", log="started\n")  # RUNNING: its stream stays open
    hook = RayHook("ray_fake")
    started, got = time.monotonic(), []
    with pytest.raises(TimeoutError):
        for line in hook.tail_job_logs("job-1", timeout_s=1):
            got.append(line)
    assert got == ["started\n"] and time.monotonic() - started < 5
    assert hook.stop_job("job-1") is True and hook.get_job_status("job-1").value == "STOPPED"
    assert hook.stop_job("job-1") is False  # Ray's answer for a job that had ended
