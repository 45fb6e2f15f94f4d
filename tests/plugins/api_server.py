"""Airflow's own api-server app (plugins, auth manager and all) under uvicorn, for the page's HTTP tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from tests.conftest import ROOT

START_TIMEOUT_S = 90


@contextlib.contextmanager
def running_api_server(log_dir: Path, **settings: str) -> Iterator[str]:
    """Start the api-server on a free loopback port with ``settings`` added to its environment.

    Yields its base URL; stops the process it started (and only that one) afterwards.
    """
    from scripts.localcluster import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include"), os.environ.get("PYTHONPATH", "")]),
           "AIRFLOW__API__BASE_URL": base, **settings}
    log_path = log_dir / "api-server.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "airflow.api_fastapi.app:create_app", "--factory",
             "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_until_healthy(process, base, log_path)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_healthy(process: subprocess.Popen, base: str, log_path: Path, timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once ``base`` answers Airflow's health check; fail, with the log's end, if ``process`` exits
    first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the api-server exited with {process.returncode}; its log ends:\n"
                               f"{log_path.read_text()[-3000:]}")
        try:
            if requests.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the api-server did not answer within {timeout_s} s; its log ends:\n"
                       f"{log_path.read_text()[-3000:]}")
