"""The wine DAG's trigger form in the real Airflow UI, filled in headless Chromium as a person would.

Airflow's api-server app runs under uvicorn (all admins) on the test metadata DB holding the
serialized wine DAG; no scheduler runs, so a triggered run stays queued and no task starts. Each
submission either creates a run, whose conf (read back through the REST API) every task must
accept (tests/dags/wine_conf.py builds what each task builds, without Ray), or is refused in the
form with a message and creates none.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time

import pytest
import requests

from tests.conftest import ROOT, allow_sources, load_dag, serialize_project_dags
from tests.dags.wine_conf import DAG_ID, build_tasks
from tests.plugins.api_server import running_api_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SECTIONS = ["Data cleaning", "Search", "Training", "Deploy", "Compute", "Demo data"]  # collapsed until opened
DEFAULT_SECTION = "Run Parameters"  # Airflow's name for the Params without a section; open
TIMEOUT_MS = 15_000
PAGE_LOAD_TIMEOUT_MS = 90_000  # a page's first load, and the click that opens the form (its code loads then)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary: install Debian's `chromium` package "
                                                "(CI's .ci/run does) to run the browser test"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is not installed: make install (the dev extra) installs it"),
]


@pytest.fixture(scope="module")
def api_server(airflow_db, tmp_path_factory):
    """The api-server, on a metadata DB that holds the wine DAG as the DAG processor would store it."""
    serialize_project_dags()
    with running_api_server(tmp_path_factory.mktemp("api"),
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        _EARLIER_RUNS.update(run["dag_run_id"] for run in _runs(base, all_runs=True))
        yield base


@pytest.fixture(scope="module")
def browser():
    """One Chromium and one browsing context (the UI's scripts load once) for the module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1280, "height": 1600},
                                       permissions=["clipboard-read", "clipboard-write"])
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        chromium.close()


@pytest.fixture
def form(api_server, browser):
    """The trigger form of the wine DAG, open in a new page; the runs it creates are deleted afterwards."""
    page = browser.new_page()
    # the UI's scripts loaded and settled before the first click: on a loaded 2-core runner the first
    # page of the module once took longer than the default timeout, and the click timed out
    page.goto(f"{api_server}/dags/{DAG_ID}", wait_until="networkidle", timeout=PAGE_LOAD_TIMEOUT_MS)
    page.get_by_role("button", name="Trigger").first.click(timeout=PAGE_LOAD_TIMEOUT_MS)
    page.get_by_role("button", name=DEFAULT_SECTION).wait_for()
    yield page
    page.close()
    _delete_runs(api_server)


@pytest.fixture(scope="module")
def dag():
    return load_dag(DAG_ID, ROOT / "dags")


_EARLIER_RUNS: set[str] = set()
"""The wine DAG's runs that other tests made before the api-server started (the session's pipeline
runs, which later tests read): the form's tests neither count nor delete them."""


def _runs(base: str, all_runs: bool = False) -> list[dict]:
    """The wine DAG's runs that the form created (``all_runs``: every run)."""
    response = requests.get(f"{base}/api/v2/dags/{DAG_ID}/dagRuns", params={"limit": 1000}, timeout=10)
    response.raise_for_status()
    return [run for run in response.json()["dag_runs"] if all_runs or run["dag_run_id"] not in _EARLIER_RUNS]


def _delete_runs(base: str) -> None:
    for run in _runs(base):
        requests.delete(f"{base}/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}", timeout=10).raise_for_status()


def _the_run(base: str) -> dict:
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not (runs := _runs(base)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(runs) == 1, runs
    return runs[0]


def expect(locator):
    from playwright.sync_api import expect as playwright_expect  # imported here: the module skips without it

    return playwright_expect(locator)


def _number(page, name: str):
    return page.locator(f'[id="number-input:element_{name}"] input')


def _trigger_button(page):
    return page.get_by_role("dialog").get_by_role("button", name="Trigger", exact=True)


def _open_section(page, name: str) -> None:
    page.get_by_role("button", name=name, exact=True).click()


def test_trigger_form_opens_the_main_params_and_collapses_the_sections(form):
    assert form.get_by_role("button", name=DEFAULT_SECTION).get_attribute("aria-expanded") == "true"
    for title in ("Data files", "Label column", "Lowest label", "Highest label", "Model families", "Scalers",
                  "Trials", "Deploy if better"):
        assert form.locator("label", has_text=title).is_visible(), title
    for section in SECTIONS:
        assert form.get_by_role("button", name=section, exact=True).get_attribute("aria-expanded") == "false"
    assert not form.locator("label", has_text="Searcher").is_visible()
    # multi-selects that show their choices, not text boxes of lines
    form.locator("#element_scalers").click()
    expect(form.get_by_role("option", name="none")).to_be_visible()
    _open_section(form, "Search")
    help_text = form.get_by_text("A whole search space").inner_text()
    assert '"family": "xgboost"' in help_text
    assert form.get_by_role("link", name="search space").get_attribute("href").endswith(
        "/docs/operators/tune.md#search-space")


def test_trigger_form_as_a_person_fills_it_runs_and_every_task_accepts_the_conf(form, api_server, dag,
                                                                                tmp_path, monkeypatch):
    # two files, a blank line between them and a newline after the last, as people type them
    form.locator("#element_source").fill("/data/red.csv\n\n/data/white.csv\n")
    _number(form, "label_min").fill("9")  # the range the wrong way round
    _number(form, "label_max").fill("3")
    form.locator("#element_families").get_by_label("Remove lightning").click()  # the trees and the linear model
    _open_section(form, "Search")
    form.locator("#element_searcher").get_by_label("Clear selected options").click()  # a cleared select
    expect(form.get_by_text("This field is required")).to_be_visible()
    expect(_trigger_button(form)).to_be_disabled()  # nothing can be sent without a searcher
    form.locator("#element_searcher").click()
    form.get_by_role("option", name="optuna").click()
    _number(form, "time_budget_s").fill("")  # a cleared number: no time limit
    expect(_trigger_button(form)).to_be_enabled()
    _trigger_button(form).click()

    conf = _the_run(api_server)["conf"]
    assert conf["source"] == ["/data/red.csv", "", "/data/white.csv", ""]
    assert (conf["label_min"], conf["label_max"]) == (9, 3)
    assert conf["families"] == ["xgboost", "extra_trees", "random_forest", "linear"]
    assert conf["searcher"] == "optuna" and conf["time_budget_s"] is None
    allow_sources(monkeypatch, "/data")  # the files lie under the allowed sources (airflow_ray_ml.confine)
    built = build_tasks(dag, conf, str(tmp_path))
    assert built["preprocess"]["source"] == ["/data/red.csv", "/data/white.csv"]
    assert built["preprocess"]["label_range"] == [3, 9]
    assert built["tune"]["search_space"]["family"] == {"choice": ["xgboost", "extra_trees", "random_forest",
                                                                  "linear"]}
    assert "lightning" not in built["tune"]["search_space"]
    assert built["tune"]["searcher"] == "optuna" and built["tune"]["time_budget_s"] is None


def test_trigger_form_one_bound_and_a_typed_search_space_run_and_every_task_accepts_them(form, api_server, dag,
                                                                                         tmp_path):
    space = {"family": "lightning", "scaler": "none", "lightning": {"max_epochs": 2}}
    _number(form, "label_min").fill("2.5")
    _open_section(form, "Search")
    # pasted, as a person copies a space in (typing it, the editor closes brackets and quotes itself)
    form.evaluate("text => navigator.clipboard.writeText(text)", json.dumps(space))
    form.locator("#element_search_space .monaco-editor").click()
    form.keyboard.press("ControlOrMeta+a")
    form.keyboard.press("ControlOrMeta+v")
    _trigger_button(form).click()

    conf = _the_run(api_server)["conf"]
    assert conf["label_min"] == 2.5 and conf["label_max"] is None and conf["source"] is None
    assert conf["search_space"] == space
    built = build_tasks(dag, conf, str(tmp_path))
    assert built["preprocess"]["label_range"] == [2.5, sys.float_info.max]
    assert built["tune"]["search_space"] == conf["search_space"]


def test_trigger_form_without_a_family_cannot_be_sent(form, api_server):
    error_mark = form.get_by_role("button", name=DEFAULT_SECTION).locator(".chakra-icon")
    assert error_mark.count() == 0
    form.locator("#element_families").get_by_label("Clear selected options").click()
    expect(_trigger_button(form)).to_be_disabled()
    expect(error_mark).to_be_visible()  # the section's title marks the error; the field itself shows none
    assert _runs(api_server) == []


def test_trigger_form_another_label_with_the_deploy_fields_as_they_start_serves_under_its_name(form, api_server,
                                                                                              dag, tmp_path):
    form.locator("#element_label_column").fill("Monthly Rent")
    _trigger_button(form).click()

    conf = _the_run(api_server)["conf"]
    assert conf["label_column"] == "Monthly Rent" and not conf["serve_app"] and not conf["serve_route"]
    built = build_tasks(dag, conf, str(tmp_path))
    assert (built["deploy"]["app_name"], built["deploy"]["route_prefix"]) == ("monthly-rent", "/monthly-rent")


def test_trigger_form_bad_route_is_refused_with_a_message_and_no_run(form, api_server):
    _open_section(form, "Deploy")
    form.locator("#element_serve_route").fill("wine")
    _trigger_button(form).click()
    message = form.get_by_text("Invalid input for param serve_route")
    message.wait_for()
    assert "does not match" in message.inner_text()
    assert _runs(api_server) == []


def test_trigger_form_conf_with_a_key_that_is_no_param_is_refused_with_a_message_and_no_run(form, api_server):
    """A person who types a key of their own into the form's configuration JSON gets the api-server's
    refusal in the form (airflow_ray_ml.plugins.known_params), naming the key, and no run."""
    form.get_by_role("button", name="Advanced Options").click()
    dialog = form.get_by_role("dialog")
    config = dialog.get_by_role("group").filter(has=form.get_by_text("Configuration JSON", exact=True))
    config.get_by_role("textbox", name="Editor content").focus()  # the JSON editor (Monaco)
    # pasted, as a person would paste a conf: typed, the editor would close each quote and brace itself
    form.evaluate("text => navigator.clipboard.writeText(text)", json.dumps({"batch_size": 0, "num_trials": 2}))
    form.keyboard.press("ControlOrMeta+a")
    form.keyboard.press("ControlOrMeta+v")
    dialog.get_by_text("Configuration JSON", exact=True).click()  # out of the editor: the form takes its text
    _trigger_button(form).click()
    message = form.get_by_text("are not Params of DAG")
    message.wait_for()
    assert "['batch_size']" in message.inner_text()
    assert _runs(api_server) == []
