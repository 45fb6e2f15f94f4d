"""The "Ray ML" page: plugin registration, rendering, and the real page in headless Chromium.

The browser test runs Airflow's own api-server app (plugins, auth manager and all) under uvicorn,
against a real search's leaderboard and the best model, trained and deployed on Ray Serve,
then loads the page in Debian's Chromium (Airflow in all-admins mode, so every request carries an admin's JWT,
as the UI's session cookie does for the page's iframe).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
import zlib
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from airflow_ray_ml.plugins import ray_ml
from tests.conftest import load_dag
from tests.plugins.api_server import running_api_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLUGIN_NAME = "ray_ml"


# -- registration -------------------------------------------------------------------------------


def test_plugin_registers_the_page_and_a_nav_view_and_no_duplicate_links():
    from airflow import plugins_manager
    from airflow.providers_manager import ProvidersManager

    info = {plugin["name"]: plugin for plugin in plugins_manager.get_plugin_info()}
    assert PLUGIN_NAME in info, sorted(info)
    plugin = info[PLUGIN_NAME]
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == [ray_ml.URL_PREFIX]
    view = plugin["external_views"][0]
    assert view["destination"] == "nav" and view["url_route"] == "ray-ml"
    assert not view["href"].startswith("/")  # resolved against the UI's base URL
    # The task links come from the provider entry point; the plugin must not add them again.
    assert plugin["operator_extra_links"] == [] and plugin["global_operator_extra_links"] == []
    provider_links = set(ProvidersManager().extra_links_class_names)
    assert {"airflow_ray_ml.links.ray.RayJobLink", "airflow_ray_ml.links.ray.RayServeEndpointLink",
            "airflow_ray_ml.links.ray.RayServeDashboardLink"} <= provider_links


# -- rendering without Ray or a Tune run ----------------------------------------------------------


def test_page_renders_notices_when_ray_is_unreachable(monkeypatch):
    from airflow_ray_ml_stages.localcluster import free_port

    monkeypatch.setenv("AIRFLOW_CONN_RAY_UI_DOWN", json.dumps(
        {"conn_type": "ray", "extra": {"dashboard_url": f"http://127.0.0.1:{free_port()}"}}))
    data = ray_ml.PageData(conn_id="ray_ui_down")
    ray_ml.load_serve(data)
    assert data.serve_error and "Cannot reach the Ray cluster" in data.serve_error
    html = ray_ml.render(data)
    assert 'id="serve-error"' in html and "Cannot reach the Ray cluster" in html
    assert 'id="tune-empty"' in html and "No Tune run has finished yet" in html


def test_page_escapes_everything_it_shows():
    hostile = '<script>alert("x")</script>'
    data = ray_ml.PageData(conn_id=hostile, dashboard_url="http://127.0.0.1:8265")
    data.apps = [ray_ml.ServedApp(name=hostile, status="RUNNING", endpoint="http://h/x", version=hostile)]
    data.tune = ray_ml.TuneRun(dag_id=hostile, run_id="r", task_id="t", map_index=-1, pushed_at="now",
                               result={"best_trial_id": hostile, "plot_uri": "/p.png"},
                               rows=[{"trial_id": hostile, "config": {"k": hostile}, "metrics": {}}])
    html = ray_ml.render(data)
    assert "<script>" not in html
    assert html.count("&lt;script&gt;") >= 5


def test_page_refuses_requests_without_an_airflow_login():
    from fastapi.testclient import TestClient

    client = TestClient(ray_ml.build_app())
    for path in ("/", "/plot.png", "/status.json"):
        response = client.get(path)
        assert response.status_code == 401, (path, response.status_code)


def test_leaderboard_that_is_not_a_list_of_rows_is_refused(tmp_path):
    path = tmp_path / "leaderboard.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a JSON list of rows"):
        ray_ml.read_leaderboard(str(path))


# -- the real page in a real browser ---------------------------------------------------------------


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG; fails on anything that is not one."""
    assert data.startswith(ray_ml.PNG_MAGIC), data[:16]
    position, idat, width, height = 8, b"", 0, 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        kind, body = data[position + 4:position + 8], data[position + 8:position + 8 + length]
        (crc,) = struct.unpack(">I", data[position + 8 + length:position + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    return width, height, zlib.decompress(idat)


def _chromium(url: str, profile: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", *extra, url],
        capture_output=True, text=True, timeout=90,
    )


@pytest.fixture(scope="module")
def served_and_tuned(airflow_db, ray_conn, tmp_path_factory):
    """A real search, its best model trained and served on Ray Serve by the deploy operator."""
    when = datetime(2026, 7, 1, tzinfo=timezone.utc)
    serve_run = load_dag("ray_ml_page_serve").test(logical_date=when, run_after=when)
    assert serve_run.state == "success"
    from tests.operators.test_ray_job import _xcom

    tuned = {**_xcom(serve_run, "tune"), "job": _xcom(serve_run, "tune", key="ray_job")}
    return _xcom(serve_run, "deploy"), _xcom(serve_run, "train"), tuned


@pytest.fixture(scope="module")
def api_server(served_and_tuned, tmp_path_factory):
    """Airflow's api-server app (with every plugin) under uvicorn on a free loopback port, all admins."""
    with running_api_server(tmp_path_factory.mktemp("api"),
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        yield base


@pytest.mark.integration
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary: install Debian's `chromium` package "
                                                "(CI's .ci/run does) to run the browser test")
def test_ray_ml_page_in_headless_chromium_shows_served_model_and_leaderboard(served_and_tuned, api_server,
                                                                              tmp_path):
    deployed, trained, tuned = served_and_tuned
    page = f"{api_server}{ray_ml.URL_PREFIX}/"

    # All-admins mode: Airflow's middleware gives every request an admin's JWT, which the page's
    # dependency on Airflow's get_user then validates (the refusal without one is tested above).
    plot = requests.get(f"{page}plot.png", timeout=30)
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    assert plot.content == Path(tuned["plot_uri"]).read_bytes()

    profile = str(tmp_path / "profile")
    started = time.monotonic()
    dom = _chromium(page, profile, "--dump-dom", "--virtual-time-budget=5000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout

    # The served application: its version, endpoint and test metrics from the model card.
    endpoint = deployed["endpoint"]
    assert 'data-app="wine-ui"' in html
    assert trained["model_version"] in html and endpoint in html
    assert f"{trained['metrics']['test']['rmse']:.4f}" in html
    dashboard = json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])["extra"]["dashboard_url"]
    assert f'href="{dashboard}/#/overview"' in html
    assert f'href="{dashboard}/#/serve/applications/wine-ui"' in html
    # The leaderboard, best first, as the tune result's JSON file has it; the plot loaded.
    rows = json.loads(Path(tuned["leaderboard_json_uri"]).read_text())
    positions = [html.index(f'data-trial="{row["trial_id"]}"') for row in rows]
    assert positions == sorted(positions)
    assert len(rows) == 4 and tuned["best_trial_id"] in html
    assert all(row["status"] in html for row in rows)
    plot_width, _, _ = _png_pixels(Path(tuned["plot_uri"]).read_bytes())
    assert 'id="tune-plot"' in html and f'data-width="{plot_width}"' in html  # the browser decoded it
    assert "<code>ray_ml_page_serve</code>" in html
    assert tuned["job"]["job_url"] in html

    shot = tmp_path / "ray-ml-page.png"
    result = _chromium(page, str(tmp_path / "profile2"), f"--screenshot={shot}", "--window-size=1280,1600",
                       "--hide-scrollbars", "--virtual-time-budget=5000")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, scanlines = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    assert len(set(scanlines)) > 50, "the screenshot is (nearly) one colour"
    print(f"browser checks took {time.monotonic() - started:.1f} s; screenshot: {shot}")
    if os.environ.get("RAYML_KEEP_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["RAYML_KEEP_SCREENSHOT"])

