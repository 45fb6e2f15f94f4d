"""The wine DAG confines the files a run's conf names: dag.test() runs on the real test cluster.

A run whose ``source`` lies outside the allowed sources fails at ``data_files``, before any Ray
job exists for it, and nothing of the file reaches a log; ``allowed_sources`` widens the roots, and
a file under the artifact root's ``data`` folder runs beside one under the widened root. Only the
tasks up to ``preprocess`` run: the rest of the DAG is marked successful (dag.test's
``mark_success_pattern``).
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import ROOT, allow_sources, load_dag
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration

CREDENTIALS = "[default]\naws_access_key_id = AKIAEXAMPLEKEY4CONFINE\naws_secret_access_key = cOnF1nEdS3cr3tK3yN0tF0rL0g5\n"
AFTER_PREPROCESS = "probe|search_space|tune|train|deploy_enabled|deploy"  # marked successful, not run


def _run(day: int, **conf):
    when = datetime(2026, 10, day, tzinfo=timezone.utc)
    return load_dag("wine_quality_pipeline", ROOT / "dags").test(
        logical_date=when, run_after=when, run_conf=conf, mark_success_pattern=AFTER_PREPROCESS)


def _states(dag_run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def _jobs_of_run(run_id: str) -> list[dict]:
    from airflow_ray_ml.hooks.ray import RayHook

    return [job for job in RayHook().list_jobs() if (job.get("metadata") or {}).get("airflow_run_id") == run_id]


def _write_table(path: Path, rows: int = 400) -> str:
    rng = np.random.default_rng(11)
    size, rooms = rng.uniform(20, 140, rows).round(1), rng.integers(1, 6, rows)
    frame = pd.DataFrame({"sqm": size, "rooms": rooms, "rent": (12 * size + 40 * rooms + rng.normal(0, 30, rows)).round()})
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return str(path)


@pytest.fixture(scope="module")
def secret_server():
    """A real HTTP server on loopback holding the credentials, counting the requests it gets."""
    requests_seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            requests_seen.append(self.path)
            body = CREDENTIALS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests_seen
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def places(artifact_root, tmp_path_factory, secret_server):
    """{case: (source, the file's lines that no log may show)}: a credentials file outside the roots
    reached by a symlink and by '..' from inside the artifact root's data folder, /etc/passwd, and
    the credentials behind a URL."""
    outside = tmp_path_factory.mktemp("outside")
    credentials = outside / "credentials"
    credentials.write_text(CREDENTIALS)
    inside = Path(artifact_root) / "data" / "confine"
    inside.mkdir(parents=True, exist_ok=True)
    (inside / "wine.csv").symlink_to(credentials)
    secret_lines = [line for line in CREDENTIALS.splitlines() if line.strip()]
    passwd = [line for line in Path("/etc/passwd").read_text().splitlines() if line.strip()]
    return {
        "etc-passwd": ("/etc/passwd", "root", passwd),
        "symlink-out": (str(inside / "wine.csv"), "[default]", secret_lines),
        "dotdot-out": (os.path.join(str(inside), os.path.relpath(credentials, inside)), "[default]", secret_lines),
        "url-out": (f"{secret_server[0]}/credentials.csv", "[default]", secret_lines),
    }


@pytest.mark.parametrize(("case", "day"), [("etc-passwd", 1), ("symlink-out", 2), ("dotdot-out", 3), ("url-out", 4)])
def test_wine_source_outside_the_allowed_sources_is_refused_before_any_job_and_never_logged(
        airflow_db, ray_conn, places, secret_server, capfd, case, day):
    source, label, secret_lines = places[case]
    dag_run = _run(day, source=[source], label_column=label, deploy=False)
    states = _states(dag_run)
    assert dag_run.state == "failed" and states["data_files"] == "failed", states
    assert states["preprocess"] == "upstream_failed", states
    assert _jobs_of_run(dag_run.run_id) == []  # probe was marked successful: no job of this run at all
    out = capfd.readouterr().out
    assert "SourceNotAllowedError" in out and "'allowed_sources' field of the Airflow connection 'ray_default'" in out
    leaked = [line for line in secret_lines if line in out]
    assert not leaked, leaked
    assert secret_server[1] == []  # the URL was never asked for


def test_wine_allowed_sources_setting_widens_the_roots_beside_the_artifact_roots_data_folder(
        airflow_db, ray_conn, artifact_root, tmp_path, monkeypatch):
    under_root = _write_table(Path(artifact_root) / "data" / "confine" / "rent.csv")
    elsewhere = _write_table(tmp_path / "flats" / "flats.csv")
    refused = _run(6, source=[under_root, elsewhere], label_column="rent", deploy=False)
    assert _states(refused)["data_files"] == "failed" and _jobs_of_run(refused.run_id) == []
    allow_sources(monkeypatch, tmp_path / "flats")
    # one run reads both: the artifact root's data folder stays allowed when the setting adds a root
    widened = _run(7, source=[under_root, elsewhere], label_column="rent", deploy=False)
    assert _states(widened)["preprocess"] == "success", _states(widened)
    assert _xcom(widened, "preprocess")["rows_read"] == 800
