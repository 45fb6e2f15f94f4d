"""RayHook: URL and token resolution, clear errors, and a real cluster's answers."""

from __future__ import annotations

import json
import os
import socket

import pytest

from airflow_ray_ml.errors import RayAuthError, RayClusterUnreachableError, RayOperatorError
from airflow_ray_ml.hooks.ray import RayHook, normalise_dashboard_url, resolve_token


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
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "ray", "extra": extra}))


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


def test_hook_default_connection_missing_uses_local_cluster(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT", raising=False)
    monkeypatch.setenv("RAY_DASHBOARD_URL", "http://127.0.0.1:18265")
    assert RayHook().dashboard_url == "http://127.0.0.1:18265"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_hook_unreachable_cluster_one_clear_sentence(monkeypatch):
    url = f"http://127.0.0.1:{_closed_port()}"
    _set_conn(monkeypatch, "ray_down", dashboard_url=url)
    hook = RayHook("ray_down", timeout_s=2)
    with pytest.raises(RayClusterUnreachableError) as caught:
        hook.check_access()
    message = str(caught.value)
    assert url in message and "make run" in message and "'ray_down'" in message
    assert caught.value.__cause__ is None and "Traceback" not in message
    ok, text = hook.test_connection()
    assert ok is False and url in text


@pytest.mark.integration
def test_hook_test_connection_real_cluster_ok(monkeypatch, ray_cluster):
    _set_conn(monkeypatch, "ray_ok", dashboard_url=ray_cluster.dashboard_url, auth_token=ray_cluster.token)
    ok, text = RayHook("ray_ok").test_connection()
    assert ok, text
    assert "Ray 2." in text and ray_cluster.dashboard_url in text


@pytest.mark.integration
def test_hook_missing_or_wrong_token_says_how_to_fix(monkeypatch, ray_cluster, tmp_path):
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token-here"))
    _set_conn(monkeypatch, "ray_notoken", dashboard_url=ray_cluster.dashboard_url)
    with pytest.raises(RayAuthError, match="HTTP 401.*RAY_AUTH_TOKEN"):
        RayHook("ray_notoken").check_access()
    _set_conn(monkeypatch, "ray_badtoken", dashboard_url=ray_cluster.dashboard_url, auth_token="wrong")
    with pytest.raises(RayAuthError, match="HTTP 403"):
        RayHook("ray_badtoken").check_access()


@pytest.mark.integration
def test_hook_cluster_resources_lists_the_head(monkeypatch, ray_cluster):
    _set_conn(monkeypatch, "ray_res", dashboard_url=ray_cluster.dashboard_url, auth_token=ray_cluster.token)
    nodes = RayHook("ray_res").get_cluster_resources()
    assert len(nodes) == 1
    (node,) = nodes.values()
    assert node["total"]["CPU"] == 2 and node["state"] == "ALIVE"


@pytest.mark.integration
def test_ray_client_info_lines_reach_the_task_log_at_info_not_stderr(ray_conn, tmp_path):
    """Airflow records a task's stderr at error level: the Ray client's INFO lines must not go there."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text("print('hello')\n")
    script = (
        "from airflow_ray_ml.hooks.ray import RayHook\n"
        "client = RayHook().get_job_client()\n"
        f"client.submit_job(entrypoint='python job.py', runtime_env={{'working_dir': {str(tmp_path / 'code')!r}}})\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])})
    assert result.returncode == 0, result.stderr
    # Airflow's own log set-up (what a task's records go through) shows the record at its level
    uploads = [line for line in result.stdout.splitlines() if "Uploading package" in line]
    assert uploads and all("info" in line.lower() and "dashboard_sdk" in line for line in uploads), result.stdout
    assert "Uploading package" not in result.stderr, result.stderr


def test_operators_and_trigger_build_no_dashboard_api_urls():
    """Every dashboard route lives in the hook (operators/hooks/); the UI links build page URLs, not /api/ ones."""
    from tests.conftest import ROOT

    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "operators").rglob("*.py")) if "hooks" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1) if "/api/" in line
    ]
    assert offenders == []


@pytest.mark.integration
def test_async_twins_answer_like_the_sync_calls(ray_conn):
    import asyncio
    import time

    hook = RayHook()
    job = hook.submit_job(entrypoint="python -c \"print('twin-1'); print('twin-2', end='')\"",
                          submission_id=f"hook-twins-{time.time_ns()}")
    lines = list(hook.tail_job_logs(job, timeout_s=120))  # ends once the job has ended

    async def async_answers():
        twin = RayHook()
        return {
            "version": await twin.a_get_version(),
            "info": await twin.a_get_job_info(job),
            "status": await twin.a_get_job_status(job),
            "missing": await twin.a_get_job_status("no-such-job"),
            "logs": await twin.a_get_job_logs(job),
            "tail": [line async for line in twin.a_tail_job_logs(job)],
            "tail_from": [line async for line in twin.a_tail_job_logs(job, offset=len(lines[0]) + 3)],
            "jobs": await twin.a_list_jobs(),
            "nodes": await twin.a_get_nodes(),
            "serve": await twin.a_get_serve_applications(),
            "stop": await twin.a_stop_job(job),
        }

    answers = asyncio.run(async_answers())
    assert answers["version"] == hook.get_version()
    assert answers["info"] == hook.get_job_info(job) and answers["status"] is hook.get_job_status(job)
    assert answers["status"].value == "SUCCEEDED" and answers["missing"] is None
    logs = hook.get_job_logs(job)
    assert answers["logs"] == logs == "".join(lines) == "".join(answers["tail"])
    assert lines[-2:] == ["twin-1\n", "twin-2"]  # the last line had no line end
    assert "".join(answers["tail_from"]) == logs[len(lines[0]) + 3:]
    assert job in {j["submission_id"] for j in answers["jobs"]} and job in {j["submission_id"] for j in hook.list_jobs()}
    assert [n["node_id"] for n in answers["nodes"]] == [n["node_id"] for n in hook.get_nodes()]
    assert answers["serve"].keys() == hook.get_serve_applications().keys()
    assert answers["stop"] is False is hook.stop_job(job)  # it had ended
    with pytest.raises(RayOperatorError, match="no-such-job does not exist"):
        list(hook.tail_job_logs("no-such-job"))


@pytest.mark.integration
def test_tail_gives_up_after_its_timeout_and_stop_ends_the_job(ray_conn):
    import time

    hook = RayHook()
    job = hook.submit_job(entrypoint="python -c \"import time; time.sleep(600)\"",
                          submission_id=f"hook-tail-timeout-{time.time_ns()}")
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            list(hook.tail_job_logs(job, timeout_s=3))
        assert time.monotonic() - started < 10
        assert hook.stop_job(job) is True
        deadline = time.monotonic() + 15
        while hook.get_job_status(job).value != "STOPPED":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        hook.stop_job(job)
