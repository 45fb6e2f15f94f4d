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
import threading
import time
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
import requests
from markupsafe import escape

from airflow_ray_ml.plugins import ray_ml
from airflow_ray_ml.plugins.ray_ml_runs import DriftRun, SelectorError, StageJob, TuneRunRef, parse_selector
from airflow_ray_ml.plugins.ray_ml_serving import HistoryEntry, ServingHistory, read_history
from airflow_ray_ml.serve_history import history_uri, serving_dir
from tests.conftest import load_dag, serialize_project_dags, serve_apps_deleted_after_module
from tests.dag_fixtures.ui_dags import UI_APP
from tests.plugins.api_server import running_api_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLUGIN_NAME = "ray_ml"
delete_own_serve_apps = serve_apps_deleted_after_module(UI_APP)


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
    assert {"airflow_ray_ml.links.ray.RayJobLink", "airflow_ray_ml.links.ray.RayJobLogLink",
            "airflow_ray_ml.links.ray.RayServeEndpointLink",
            "airflow_ray_ml.links.ray.RayServeDashboardLink"} <= provider_links


# -- rendering without Ray or a Tune run ----------------------------------------------------------


def test_page_renders_notices_when_ray_is_unreachable(monkeypatch):
    from scripts.localcluster import free_port

    monkeypatch.setenv("AIRFLOW_CONN_RAY_UI_DOWN", json.dumps(
        {"conn_type": "ray_ml", "extra": {"dashboard_url": f"http://127.0.0.1:{free_port()}"}}))
    data = ray_ml.PageData(conn_id="ray_ui_down")
    ray_ml.load_serve(data)
    assert data.serve_error and "Cannot reach the Ray cluster" in data.serve_error
    html = ray_ml.render(data)
    assert 'id="serve-error"' in html and "Cannot reach the Ray cluster" in html
    assert 'id="tune-empty"' in html and "No Tune run has finished yet" in html


def test_page_escapes_everything_it_shows():
    hostile = '<script>alert("x")</script>'
    data = ray_ml.PageData(conn_id=hostile, dashboard_url="http://127.0.0.1:8265", readable={hostile})
    history = ServingHistory(uri="/h", total=1, entries=[HistoryEntry(
        at=hostile, action=hostile, dag_id=hostile, run_id=hostile, challenger_version=hostile, reason=hostile,
        live_trial=hostile, approval=hostile)])
    drift = [DriftRun(hostile, hostile, hostile, -1, hostile, hostile, hostile, hostile, hostile,
                      ((hostile, 0.5, hostile),), hostile)]
    data.apps = [ray_ml.ServedApp(name=hostile, status="RUNNING", endpoint="http://h/x", version=hostile,
                                  history=history, drift=drift)]
    data.tune_runs = [TuneRunRef(hostile, hostile, hostile, -1, hostile)]
    data.tune = ray_ml.TuneRun(dag_id=hostile, run_id="r", task_id="t", map_index=-1, pushed_at="now",
                               result={"best_trial_id": hostile, "plot_uri": "/p.png"},
                               rows=[{"trial_id": hostile, "config": {"k": hostile}, "metrics": {}}])
    data.jobs = [StageJob(hostile, "r", hostile, -1, hostile, message=hostile)]
    html = ray_ml.render(data)
    assert hostile not in html and "<script>alert" not in html
    assert html.count("&lt;script&gt;") >= 24


def test_history_of_an_application_reads_newest_first_and_names_any_action(tmp_path):
    from airflow_ray_ml_stages import artifacts

    uri = history_uri(serving_dir(str(tmp_path), "wine-x"))
    artifacts.write_json_atomic(uri, [
        {"at": "2026-07-01T10:00:00+00:00", "action": "promoted", "challenger_version": "v1", "metric": "rmse",
         "challenger": 0.7, "champion": None, "reason": "no champion yet"},
        {"at": "2026-07-02T10:00:00+00:00", "action": "kept_champion", "challenger_version": "v2",
         "champion_version": "v1", "metric": "rmse", "challenger": 0.75, "champion": 0.7},
        {"at": "2026-07-03T10:00:00+00:00", "action": "rollback", "version": "v0", "from_version": "v1"},
        {"at": "2026-07-04T10:00:00+00:00", "action": "frozen_by_ops", "version": "v0"},
        "not a decision",
    ])
    history = read_history(str(tmp_path), "wine-x")
    assert history.error is None and history.total == 4
    assert [entry.action for entry in history.entries] == ["frozen_by_ops", "rollback", "kept_champion", "promoted"]
    served = [(entry.served_version, entry.other_version) for entry in history.entries]
    assert served == [("v0", ""), ("v0", "v1"), ("v1", "v2"), ("v1", "")]
    assert history.entries[0].label == "frozen by ops"
    data = ray_ml.PageData(conn_id="c")
    data.apps = [ray_ml.ServedApp(name="wine-x", status="RUNNING", endpoint="", version="v0", history=history)]
    html = ray_ml.render(data)
    assert html.index('data-action="frozen_by_ops"') < html.index('data-action="promoted"')
    assert 'data-app="wine-x" data-version="v1">Pin</button>' in html  # a promoted version not served now


def test_history_shows_each_decisions_live_trial_and_who_answered_its_approval(tmp_path):
    from airflow_ray_ml_stages import artifacts

    shadow = {"mode": "shadow", "share": 1.0, "compared_rows": 300, "agreement": 0.934,
              "challenger": {"requests": 300, "rows": 300, "failures": 0, "answer_ms": {"p50": 1.26}},
              "champion": {"requests": 310, "failures": 0, "answer_ms": {"p50": 1.18}},
              "live": {"metric": "rmse", "rows": 120, "challenger": 0.7472, "champion": 0.8537}}
    canary = {"mode": "canary", "share": 0.1, "challenger": {"requests": 40, "rows": 40, "failures": 40,
                                                             "answer_ms": {"p50": None}}, "champion": {}}
    artifacts.write_json_atomic(history_uri(serving_dir(str(tmp_path), "wine-live")), [
        {"at": "2026-07-01T10:00:00+00:00", "action": "promoted", "challenger_version": "v2",
         "champion_version": "v1", "rollout": shadow,
         "approval": {"approved": True, "by": "ana", "at": "2026-07-01T09:59:00+00:00", "reason": "as agreed"}},
        {"at": "2026-07-02T10:00:00+00:00", "action": "rolled_back", "challenger_version": "v3",
         "champion_version": "v2", "rollout": canary},
        {"at": "2026-07-03T10:00:00+00:00", "action": "kept_champion", "challenger_version": "v4",
         "champion_version": "v2", "reason": "rejected by bo: wait for the audit",
         "approval": {"approved": False, "by": "bo", "reason": "wait for the audit"}},
        {"at": "2026-07-04T10:00:00+00:00", "action": "kept_champion", "challenger_version": "v5",
         "champion_version": "v2", "approval": {"approved": False, "by": None}},
    ])
    history = read_history(str(tmp_path), "wine-live")
    timed_out, rejected, rolled_back, promoted = history.entries
    assert promoted.live_trial == ("shadow 100%, 300 rows compared, agreement 93%, failed 0 of 300 requests, "
                                   "answer time 1.3 ms vs 1.2 ms, live rmse 0.7472 vs 0.8537 on 120 labelled rows")
    assert promoted.approval == "approved by ana: as agreed"  # the reason the approver typed
    assert rolled_back.live_trial == "canary 10%, 40 rows answered, failed 40 of 40 requests, answer time ? ms vs ? ms"
    assert (rolled_back.approval, rejected.approval) == ("", "rejected by bo")
    assert (rejected.live_trial, timed_out.approval) == ("", "rejected: no answer in time")
    data = ray_ml.PageData(conn_id="c")
    data.apps = [ray_ml.ServedApp(name="wine-live", status="RUNNING", endpoint="", version="v2", history=history)]
    html = ray_ml.render(data)
    assert f'<td class="live-trial">{promoted.live_trial}</td>' in html
    assert '<td class="approval">approved by ana: as agreed</td>' in html and '<td class="approval">rejected by bo</td>' in html


def test_a_live_trial_in_progress_shows_what_its_deploy_last_kept_of_it_and_only_if_it_is_this_trial():
    from airflow_ray_ml.plugins.ray_ml_serving import trial_progress_text

    rollout = {"mode": "canary", "share": 0.1, "challenger_version": "v2"}
    record = {"mode": "canary", "share": 0.1, "challenger_version": "v2", "champion_version": "v1",
              "started_at": "2026-12-07T10:00:00.000+00:00", "rows_wanted": 300, "ends_by": "2026-12-07T10:10:00+00:00",
              "updated_at": "2026-12-07T10:01:00.000+00:00",
              "stats": {"challenger": {"rows": 42, "requests": 40, "failures": 1, "answer_ms": {"p50": 3.0}},
                        "champion": {"answer_ms": {"p50": 2.0}}}}
    text = trial_progress_text(rollout, record)
    assert text.startswith("canary of v2 beside v1 since 2026-12-07T10:00:00.000+00:00: 42 of 300 rows for the verdict; "
                           "canary 10%, 42 rows answered, failed 1 of 40 requests, answer time 3.0 ms vs 2.0 ms")
    assert text.endswith("(as of 2026-12-07T10:01:00.000+00:00; the verdict by 2026-12-07T10:10:00+00:00 at the latest)")
    # a record left by an earlier trial, or none yet: the trial the config carries, without numbers
    assert trial_progress_text(rollout, {**record, "challenger_version": "v1"}) == "canary of v2 starting: no statistics yet"
    assert trial_progress_text(rollout, None) == "canary of v2 starting: no statistics yet"
    starting = trial_progress_text(rollout, {**record, "stats": {}, "ends_by": None})
    assert ": 0 of 300 rows for the verdict; " in starting and starting.endswith("; its replica starting)")


def test_history_that_is_missing_or_unreadable_becomes_a_sentence(tmp_path):
    missing = read_history(str(tmp_path), "nothing-here")
    assert missing.entries == [] and "No deploy has recorded a decision" in missing.error
    (tmp_path / "serving" / "broken").mkdir(parents=True)
    (tmp_path / "serving" / "broken" / "history.json").write_text("{not json")
    broken = read_history(str(tmp_path), "broken")
    assert broken.entries == [] and "cannot be read" in broken.error
    data = ray_ml.PageData(conn_id="c")
    data.apps = [ray_ml.ServedApp(name="broken", status="RUNNING", endpoint="", history=broken)]
    assert "cannot be read" in ray_ml.render(data)


@pytest.mark.parametrize("selector", ["", "dag-only", "d/r/t", "d/r/t/x", "d/r/t/-2", "d//t/-1", "d d/r/t/-1"])
def test_tune_selector_that_is_malformed_is_refused_naming_the_shape(selector):
    with pytest.raises(SelectorError, match="<dag_id>/<run_id>/<task_id>/<map_index>"):
        parse_selector(selector)


def test_tune_selector_keeps_a_run_id_with_slashes_and_pluses():
    ref = parse_selector("wine/manual__2026-07-01T00:00:00+00:00/x/y/tune/3")
    assert (ref.dag_id, ref.run_id, ref.task_id, ref.map_index) == ("wine", "manual__2026-07-01T00:00:00+00:00/x/y",
                                                                   "tune", 3)
    assert parse_selector(ref.selector) == ref


def test_page_refuses_requests_without_an_airflow_login():
    from fastapi.testclient import TestClient

    client = TestClient(ray_ml.build_app())
    for path in ("/", "/plot.png", "/status.json", "/jobs/airflow-x-tune-0123456789abcdef"):
        response = client.get(path)
        assert response.status_code == 401, (path, response.status_code)
    response = client.post("/apps/wine/actions", json={"version": None}, headers={ray_ml.ACTION_HEADER: "1"})
    assert response.status_code == 401


def test_leaderboard_shows_an_ensemble_row_by_its_trials_and_a_trial_by_its_config():
    folds = [{"trial_id": "a1", "family": "xgboost", "weight": 0.15, "fold": fold,
              "model_dir": f"/artifacts/tune/trials/a1/model/members/{fold}", "config": {"eta": 0.3}} for fold in range(5)]
    ensemble = {"trial_id": "ensemble", "family": "ensemble", "metrics": {},
                "config": {"family": "ensemble", "members": [*folds, {"trial_id": "b2", "family": "linear",
                                                                       "weight": 0.25, "model_dir": "/m/b2"}]}}
    trial = {"trial_id": "b2", "family": "linear", "metrics": {}, "config": {"alpha": 0.5, "family": "linear"}}
    data = ray_ml.PageData(conn_id="ray_default")
    data.tune = ray_ml.TuneRun(dag_id="d", run_id="r", task_id="tune", map_index=-1, pushed_at="now",
                               result={"best_trial_id": "ensemble", "best_config": ensemble["config"]},
                               rows=[ensemble, trial])
    html = ray_ml.render(data)
    assert html.count("a1 (xgboost, 5 folds) x 0.75, b2 (linear) x 0.25") == 2 and "/members/" not in html
    assert "{&#34;alpha&#34;: 0.5, &#34;family&#34;: &#34;linear&#34;}" in html


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
    """A real search, its best model trained and served on Ray Serve by the deploy operator (a
    promotion), then a second, one-trial search and a second deploy of that model that keeps the
    champion (``ray_ml_page_followup``, on the first run's data and model, a day later)."""
    from tests.operators.test_ray_job import _xcom

    when = datetime(2026, 7, 1, tzinfo=timezone.utc)
    serve_run = load_dag("ray_ml_page_serve").test(logical_date=when, run_after=when)
    assert serve_run.state == "success"
    tuned = {**_xcom(serve_run, "tune"), "job": _xcom(serve_run, "tune", key="ray_job")}
    model, data = _xcom(serve_run, "train"), _xcom(serve_run, "preprocess")
    later = when + timedelta(days=1)
    followup = load_dag("ray_ml_page_followup").test(logical_date=later, run_after=later,
                                                      run_conf={"model": model, "data": data})
    assert followup.state == "success"
    deploy_state = {ti.task_id: ti.state for ti in followup.get_task_instances()}
    assert deploy_state == {"tune": "success", "deploy": "skipped"}, deploy_state  # skipped: kept the champion
    return {"deployed": _xcom(serve_run, "deploy"), "trained": model, "tuned": tuned, "serve_run": serve_run,
            "followup_run": followup, "followup_tuned": _xcom(followup, "tune")}


@pytest.fixture(scope="module")
def api_server(served_and_tuned, tmp_path_factory):
    """Airflow's api-server app (with every plugin) under uvicorn on a free loopback port, all admins."""
    with running_api_server(tmp_path_factory.mktemp("api"),
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        yield base


def _selector(dag_run) -> str:
    return f"{dag_run.dag_id}/{dag_run.run_id}/tune/-1"


def _dom(url: str, profile: str) -> str:
    """The page's DOM after its scripts and images ran, as headless Chromium has it."""
    dom = _chromium(url, profile, "--dump-dom", "--virtual-time-budget=5000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


def dom_signed_in(url: str, token: str, profile: str) -> str:
    """:func:`_dom` of ``url`` for the user whose Airflow JWT is ``token``, signed in as the UI signs in:
    its ``_token`` cookie. A page on another port of the same host sets it (a cookie is the host's,
    whatever the port) and goes on to ``url``."""
    import http.server

    host = url.split("/")[2].split(":")[0]
    hop = (f"<script>document.cookie = '_token={token}; path=/'; location.replace({json.dumps(url)});</script>")

    class SetCookie(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = hop.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, 0), SetCookie)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return _dom(f"http://{host}:{server.server_address[1]}/", profile)
    finally:
        server.shutdown()
        server.server_close()


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary: install Debian's `chromium` "
                                                             "package (CI's .ci/run does) to run the browser test")


@pytest.mark.integration
@pytest.mark.browser
@needs_chromium
def test_ray_ml_page_in_headless_chromium_shows_two_tune_runs_and_switches_between_them(served_and_tuned,
                                                                                        api_server, tmp_path):
    tuned, followup = served_and_tuned["tuned"], served_and_tuned["followup_tuned"]
    older, newer = _selector(served_and_tuned["serve_run"]), _selector(served_and_tuned["followup_run"])
    page = f"{api_server}{ray_ml.URL_PREFIX}/"

    # All-admins mode: Airflow's middleware gives every request an admin's JWT, which the page's
    # dependency on Airflow's get_user then validates (the refusal without one is tested above).
    status = requests.get(f"{page}status.json", timeout=60).json()
    assert [run["selector"] for run in status["tune_runs"]][:2] == [newer, older]  # newest first
    assert status["tune"]["selector"] == newer and status["tune"]["rows"] == 1
    # the older run's leaderboard: its four trials, and their ensemble's row where it beat them
    rows = json.loads(Path(tuned["leaderboard_json_uri"]).read_text())
    assert len([row for row in rows if row["trial_id"] != "ensemble"]) == 4
    switched = requests.get(f"{page}status.json", params={"tune": older}, timeout=60).json()
    assert switched["tune"]["selector"] == older and switched["tune"]["rows"] == len(rows)
    plot = requests.get(f"{page}plot.png", params={"tune": older}, timeout=30)
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    assert plot.content == Path(tuned["plot_uri"]).read_bytes()
    assert requests.get(f"{page}plot.png", timeout=30).content == Path(followup["plot_uri"]).read_bytes()

    started = time.monotonic()
    # The default: the newest run, one trial, chosen in the picker; its plot above its table.
    html = _dom(page, str(tmp_path / "profile"))
    assert f'data-selector="{newer}"' in html
    assert f'<option value="{newer}" selected="">' in html and f'<option value="{older}">' in html
    assert html.count('class="trial"') == 1 and f'data-trial="{followup["best_trial_id"]}"' in html
    assert html.index('id="tune-plot"') < html.index('id="leaderboard"')
    # The older run, by the picker's value: its rows best first, its plot decoded by the browser.
    html = _dom(f"{page}?{urlencode({'tune': older})}", str(tmp_path / "profile-older"))
    assert f'data-selector="{older}"' in html and f'<option value="{older}" selected="">' in html
    positions = [html.index(f'data-trial="{row["trial_id"]}"') for row in rows]
    assert positions == sorted(positions) and html.count('class="trial"') == len(rows)
    assert all(row["status"] in html for row in rows)
    plot_width, _, _ = _png_pixels(Path(tuned["plot_uri"]).read_bytes())
    assert 'id="tune-plot"' in html and f'data-width="{plot_width}"' in html
    assert "<code>ray_ml_page_serve</code>" in html and tuned["job"]["job_url"] in html

    # The served application: its version, endpoint and test metrics from the model card.
    deployed, trained = served_and_tuned["deployed"], served_and_tuned["trained"]
    assert 'data-app="wine-ui"' in html
    assert trained["model_version"] in html and deployed["endpoint"] in html
    assert f"{trained['metrics']['test']['rmse']:.4f}" in html
    dashboard = json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])["extra"]["dashboard_url"]
    assert f'href="{dashboard}/#/overview"' in html and 'id="dashboard-token-help"' in html
    assert f'href="{dashboard}/#/serve/applications/wine-ui"' in html
    # A selector of no run the user may read: the page still renders, says so, and answers 404.
    missing = requests.get(page, params={"tune": "no_such_dag/r/tune/-1"}, timeout=60)
    assert missing.status_code == 404 and 'id="selection-error"' in missing.text
    assert requests.get(page, params={"tune": "not a selector"}, timeout=60).status_code == 400

    shot = tmp_path / "ray-ml-page.png"
    result = _chromium(f"{page}?{urlencode({'tune': older})}", str(tmp_path / "profile2"),
                       f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars",
                       "--virtual-time-budget=5000")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, scanlines = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 1600)
    assert len(set(scanlines)) > 50, "the screenshot is (nearly) one colour"
    print(f"browser checks took {time.monotonic() - started:.1f} s; screenshot: {shot}")
    if os.environ.get("RAYML_KEEP_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["RAYML_KEEP_SCREENSHOT"])


@pytest.mark.integration
@pytest.mark.browser
@needs_chromium
def test_ray_ml_page_in_headless_chromium_shows_version_history_after_a_promotion_and_a_kept_champion(
        served_and_tuned, api_server, tmp_path):
    version = served_and_tuned["trained"]["model_version"]
    page = f"{api_server}{ray_ml.URL_PREFIX}/"
    status = requests.get(f"{page}status.json", timeout=60).json()
    app = next(app for app in status["applications"] if app["name"] == "wine-ui")
    entries = app["history"]["entries"]
    assert [entry["action"] for entry in entries][:2] == ["kept_champion", "promoted"], entries
    kept, promoted = entries[0], entries[1]
    assert (kept["dag_id"], kept["challenger_version"], kept["champion_version"]) == (
        "ray_ml_page_followup", version, version)
    assert kept["metric"] == "rmse" and "needs 1e+06 better" in kept["reason"]
    assert (promoted["dag_id"], promoted["challenger_version"]) == ("ray_ml_page_serve", version)

    html = _dom(page, str(tmp_path / "profile"))
    section = html[html.index('data-history-app="wine-ui"'):]
    section = section[:section.index("</section>")]
    assert section.index('data-action="kept_champion"') < section.index('data-action="promoted"')
    assert "kept champion" in section and "needs 1e+06 better" in section
    assert f"{kept['challenger']:.4f}" in section and f"{kept['champion']:.4f}" in section
    assert 'href="../dags/ray_ml_page_followup/runs/' in section  # the deciding run, in Airflow's UI
    assert 'data-app="wine-ui" data-version="">Roll back to the previous model</button>' in section
    assert '<span class="muted">serving</span>' in section  # the promoted version is the live one: no Pin


@pytest.mark.integration
def test_page_lists_the_drift_of_each_file_the_served_model_scored_worst_column_first(served_and_tuned, api_server,
                                                                                        tmp_path):
    from airflow_ray_ml_stages import wine

    frame = wine.generate(rows=400, seed=5).drop(columns=[wine.LABEL])
    frame["alcohol"] = frame["alcohol"] + 2 * frame["alcohol"].std()
    moved = tmp_path / "moved-wines.csv"
    frame.to_csv(moved, index=False)
    when = datetime(2026, 7, 5, tzinfo=timezone.utc)
    scoring = load_dag("score_file").test(logical_date=when, run_after=when,
                                          run_conf={"input": str(moved), "model": served_and_tuned["trained"]})
    assert scoring.state == "success"
    page = f"{api_server}{ray_ml.URL_PREFIX}/"
    status = requests.get(f"{page}status.json", timeout=60).json()
    app = next(app for app in status["applications"] if app["name"] == UI_APP)
    (run,) = [run for run in app["drift"] if run["run_id"] == scoring.run_id]
    assert (run["verdict"], run["input_uri"], run["dag_id"]) == ("drift", str(moved), "score_file")
    assert run["model_version"] == served_and_tuned["trained"]["model_version"]
    assert run["columns"][0][0] == "alcohol" and run["columns"][0][2] == "drift", run["columns"]

    html = requests.get(page, timeout=60).text
    section = html[html.index(f'data-history-app="{UI_APP}"'):]
    section = section[:section.index("</section>")]
    assert 'class="drift-run" data-verdict="drift"' in section
    assert f'<span class="drift-drift">alcohol ({run["columns"][0][1]:.2f})</span>' in section
    assert f'href="../dags/score_file/runs/{quote(scoring.run_id)}"' in section  # the scoring run, in Airflow's UI


@pytest.mark.integration
def test_job_detail_shows_a_real_jobs_status_and_log_tail_without_the_dashboard_token(served_and_tuned,
                                                                                     api_server):
    from airflow_ray_ml.hooks.ray import RayHook

    job = served_and_tuned["tuned"]["job"]
    page = f"{api_server}{ray_ml.URL_PREFIX}/"
    status = requests.get(f"{page}status.json", params={"tune": _selector(served_and_tuned["serve_run"])},
                          timeout=60).json()
    jobs = {stage["task_id"]: stage for stage in status["jobs"]}
    assert set(jobs) == {"demo_data", "preprocess", "tune", "train"}, jobs  # the deploy runs no Ray job
    assert all(stage["status"] == "SUCCEEDED" for stage in jobs.values()) and status["jobs_error"] is None
    assert jobs["tune"]["submission_id"] == job["submission_id"]

    # No bearer token for Ray here: the api-server reads the job through the `ray_ml` connection.
    response = requests.get(f"{page}jobs/{job['submission_id']}", timeout=60)
    assert response.status_code == 200, response.text
    assert 'id="job-state">SUCCEEDED<' in response.text
    log_lines = RayHook().get_job_logs(job["submission_id"]).splitlines()
    tail = str(escape("\n".join(log_lines[-ray_ml.LOG_TAIL_LINES:])))  # as the template escapes it
    assert tail in response.text and job["job_url"] in response.text
    assert requests.get(f"{page}jobs/airflow-ray-ml-page-serve-tune-0000000000000000", timeout=60).status_code == 404
    assert requests.get(f"{page}jobs/not%20an%20id", timeout=60).status_code == 400


@pytest.mark.integration
def test_task_link_ray_job_log_opens_the_jobs_page_view_as_airflow_computes_it(served_and_tuned, api_server):
    """The "Ray job log" extra link of a stage task, as Airflow's REST API gives it to the UI,
    leads to the page's job view (no Ray token), next to the dashboard's "Ray job" link."""
    run, job = served_and_tuned["serve_run"], served_and_tuned["tuned"]["job"]
    links = requests.get(f"{api_server}/api/v2/dags/{run.dag_id}/dagRuns/{run.run_id}/taskInstances/tune/links",
                         timeout=60)
    assert links.status_code == 200, links.text
    extra = links.json()["extra_links"]
    assert extra["Ray job"] == job["job_url"]
    assert extra["Ray job log"] == f"{ray_ml.URL_PREFIX}/jobs/{job['submission_id']}"  # root-relative: no base_url
    view = requests.get(f"{api_server}{extra['Ray job log']}", timeout=60)
    assert view.status_code == 200 and 'id="job-state">SUCCEEDED<' in view.text


@pytest.mark.integration
def test_serve_action_refuses_a_post_without_its_header_a_bad_body_and_what_cannot_be_served(served_and_tuned,
                                                                                             api_server):
    version = served_and_tuned["trained"]["model_version"]
    actions = f"{api_server}{ray_ml.URL_PREFIX}/apps/wine-ui/actions"
    # What a cross-site form could send: no custom header.
    refused = requests.post(actions, json={"version": None}, timeout=60)
    assert refused.status_code == 403 and ray_ml.ACTION_HEADER in refused.json()["detail"]
    header = {ray_ml.ACTION_HEADER: "1"}
    for body in ({"version": 3}, {"version": None, "force": True}, ["v1"]):
        bad = requests.post(actions, json=body, headers=header, timeout=60)
        assert bad.status_code == 400 and '{"version": null}' in bad.json()["detail"], (body, bad.text)
    # Through serve_actions, with the rollback DAG in Airflow's DB: refusals that trigger no run
    # (a run would wait for a scheduler, and another module's scheduler would then run it).
    serialize_project_dags()
    first = requests.post(actions, json={"version": None}, headers=header, timeout=60)
    assert first.status_code == 409 and version in first.json()["detail"], first.text  # nothing before it
    unknown = requests.post(actions, json={"version": "xgboost-never-promoted"}, headers=header, timeout=60)
    assert unknown.status_code == 404 and "never promoted" in unknown.json()["detail"], unknown.text
