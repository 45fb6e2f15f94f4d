"""Who sees what on the "Ray ML" page: only the Tune runs of DAGs the logged-in user may read.

Airflow's api-server runs under uvicorn with a real auth manager (``DagGrantAuthManager``: Airflow's
SimpleAuthManager plus per-user DAG grants), users log in through its ``/auth/token`` endpoint, and
the page is read with their tokens over HTTP. The DAG runs are made here, by ``dag.test()`` of two
small DAGs whose ``tune`` task pushes a Tune-shaped manifest with ``multiple_outputs=True``; no Ray
cluster is needed (the page's Serve section then says Ray cannot be reached).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests

from airflow_ray_ml.job_status import base_submission_id
from airflow_ray_ml.plugins import ray_ml
from tests.conftest import load_dag, serialize_project_dags
from tests.plugins.api_server import running_api_server
from tests.plugins.dag_fixtures.page_access_dags import DAG_IDS, plot_width

FIXTURES = Path(__file__).parent / "dag_fixtures"
BUNDLE = {"name": "ray-ml-page-access", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
          "kwargs": {"path": str(FIXTURES)}}
DAG_A, DAG_B = DAG_IDS
# user -> the DAGs granted to them; every user is a viewer, which in SimpleAuthManager reads every DAG
GRANTS = {"reader_a": [DAG_A], "reader_b": [DAG_B], "no_grants": []}


@pytest.fixture(scope="module")
def tune_runs(airflow_db, tmp_path_factory) -> dict:
    """One fresh successful run of each fixture DAG: ``{dag_id: DagRun}``."""
    bundles = json.loads(os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"])
    artifact_dir = str(tmp_path_factory.mktemp("page-access-artifacts"))
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        # dag.test() runs DAGs of configured bundles only; this folder is one for these runs.
        patch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([BUNDLE, *bundles]))
        for dag_id in DAG_IDS:
            run = load_dag(dag_id, folder=FIXTURES).test(run_conf={"artifact_dir": artifact_dir})
            assert run.state == "success", (dag_id, run.state)
            runs[dag_id] = run
    return runs


@pytest.fixture(scope="module")
def page_server(tune_runs, tmp_path_factory):
    """The api-server with DagGrantAuthManager, its users' passwords written beforehand."""
    from scripts.localcluster import free_port

    home = tmp_path_factory.mktemp("page-access-api")
    passwords = {user: f"{user}-password" for user in GRANTS}
    (home / "passwords.json").write_text(json.dumps(passwords))
    with running_api_server(
        home,
        AIRFLOW__CORE__AUTH_MANAGER="tests.plugins.dag_grant_auth_manager.DagGrantAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=",".join(f"{user}:viewer" for user in GRANTS),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json"),
        AIRFLOW__DAG_GRANTS__GRANTS=json.dumps(GRANTS),
        # a Ray connection nobody listens on: the page must not depend on any cluster on this machine
        AIRFLOW__RAY_ML__RAY_CONN_ID="ray_page_access",
        AIRFLOW_CONN_RAY_PAGE_ACCESS=json.dumps(
            {"conn_type": "ray_ml", "extra": {"dashboard_url": f"http://127.0.0.1:{free_port()}"}}),
    ) as base:
        yield base, passwords


def _token(base: str, username: str, password: str) -> str:
    response = requests.post(f"{base}/auth/token", json={"username": username, "password": password}, timeout=30)
    assert response.status_code == 201, (username, response.status_code, response.text)
    return response.json()["access_token"]


def _get(base: str, token: str, path: str) -> requests.Response:
    return requests.get(f"{base}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _run_markers(run) -> list[str]:
    """What on the page would show that ``run``'s Tune result is there."""
    return [run.run_id, f'data-trial="{run.dag_id}-trial-1"', _submission_id(run)]


def _submission_id(run) -> str:
    return base_submission_id(run.dag_id, run.run_id, "tune")


def _selector(run) -> str:
    return f"{run.dag_id}/{run.run_id}/tune/-1"


@pytest.mark.parametrize(("user", "readable", "hidden"), [("reader_a", DAG_A, DAG_B), ("reader_b", DAG_B, DAG_A)])
def test_page_with_access_to_one_dag_shows_its_tune_run_and_not_the_others(page_server, tune_runs, user,
                                                                             readable, hidden):
    base, passwords = page_server
    token = _token(base, user, passwords[user])
    # Airflow's own API agrees on what this user may read: the grant is in force, not just on the page.
    assert _get(base, token, f"/api/v2/dags/{readable}").status_code == 200
    assert _get(base, token, f"/api/v2/dags/{hidden}").status_code == 403

    status = _get(base, token, f"{ray_ml.URL_PREFIX}/status.json")
    assert status.status_code == 200, status.text
    tune = status.json()["tune"]
    assert tune is not None, status.json()
    assert (tune["dag_id"], tune["run_id"], tune["task_id"]) == (readable, tune_runs[readable].run_id, "tune")
    assert tune["rows"] == 2 and tune["leaderboard_error"] is None
    assert tune["job_url"].endswith(_submission_id(tune_runs[readable]))

    html = _get(base, token, f"{ray_ml.URL_PREFIX}/").text
    assert all(marker in html for marker in _run_markers(tune_runs[readable])), html
    assert not any(marker in html for marker in _run_markers(tune_runs[hidden]))
    assert hidden not in html
    assert 'id="serve-error"' in html  # the rest of the page still renders

    plot = _get(base, token, f"{ray_ml.URL_PREFIX}/plot.png")
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    width = int.from_bytes(plot.content[16:20], "big")  # IHDR's width
    assert width == plot_width(readable)


def test_page_without_access_to_any_dag_shows_no_tune_run(page_server, tune_runs):
    base, passwords = page_server
    token = _token(base, "no_grants", passwords["no_grants"])

    status = _get(base, token, f"{ray_ml.URL_PREFIX}/status.json")
    assert status.status_code == 200, status.text
    assert status.json()["tune"] is None and status.json()["tune_error"] is None
    assert status.json()["tune_runs"] == []

    html = _get(base, token, f"{ray_ml.URL_PREFIX}/").text
    assert 'id="tune-empty"' in html
    for run in tune_runs.values():
        assert not any(marker in html for marker in _run_markers(run))
    assert _get(base, token, f"{ray_ml.URL_PREFIX}/plot.png").status_code == 404


def test_page_refuses_a_token_it_cannot_verify_and_a_request_without_one(page_server):
    base, _ = page_server
    response = _get(base, "not-a-jwt", f"{ray_ml.URL_PREFIX}/status.json")
    assert response.status_code == 403, response.status_code
    assert requests.get(f"{base}{ray_ml.URL_PREFIX}/status.json", timeout=30).status_code == 401


@pytest.mark.parametrize(("user", "readable", "hidden"), [("reader_a", DAG_A, DAG_B), ("reader_b", DAG_B, DAG_A)])
def test_tune_picker_lists_only_readable_runs_and_refuses_a_selector_of_another_dag(page_server, tune_runs, user,
                                                                                    readable, hidden):
    base, passwords = page_server
    token = _token(base, user, passwords[user])
    status = _get(base, token, f"{ray_ml.URL_PREFIX}/status.json").json()
    assert {run["dag_id"] for run in status["tune_runs"]} == {readable}
    assert _selector(tune_runs[readable]) in [run["selector"] for run in status["tune_runs"]]

    # The other DAG's run, named exactly: answered as if it did not exist.
    other = {"tune": _selector(tune_runs[hidden])}
    refused = requests.get(f"{base}{ray_ml.URL_PREFIX}/status.json", params=other,
                           headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert refused.status_code == 404 and refused.json()["tune"] is None
    assert "among the DAGs you may read" in refused.json()["selection_error"]
    page = requests.get(f"{base}{ray_ml.URL_PREFIX}/", params=other, headers={"Authorization": f"Bearer {token}"},
                        timeout=60)
    assert page.status_code == 404 and 'id="selection-error"' in page.text
    # the notice repeats the selector asked for; nothing of that run's results is shown
    assert not any(marker in page.text for marker in _run_markers(tune_runs[hidden])[1:])
    assert f'<option value="{other["tune"]}"' not in page.text
    plot = requests.get(f"{base}{ray_ml.URL_PREFIX}/plot.png", params=other,
                        headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert plot.status_code == 404
    # Its own run, named exactly, is shown.
    own = requests.get(f"{base}{ray_ml.URL_PREFIX}/status.json", params={"tune": _selector(tune_runs[readable])},
                       headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert own.status_code == 200 and own.json()["tune"]["dag_id"] == readable
    malformed = requests.get(f"{base}{ray_ml.URL_PREFIX}/status.json", params={"tune": f"{readable}/only-two"},
                             headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert malformed.status_code == 400 and "<dag_id>/<run_id>/<task_id>/<map_index>" in malformed.text


def test_job_detail_answers_404_for_a_job_of_a_dag_the_user_may_not_read(page_server, tune_runs):
    base, passwords = page_server
    job_a = _submission_id(tune_runs[DAG_A])
    for user in ("reader_b", "no_grants"):
        token = _token(base, user, passwords[user])
        response = _get(base, token, f"{ray_ml.URL_PREFIX}/jobs/{job_a}")
        assert response.status_code == 404, (user, response.status_code)
        assert tune_runs[DAG_A].run_id not in response.text
    # The reader of DAG A gets the job's page; Ray is down here, which the page says.
    token = _token(base, "reader_a", passwords["reader_a"])
    response = _get(base, token, f"{ray_ml.URL_PREFIX}/jobs/{job_a}")
    assert response.status_code == 200, response.text
    assert 'id="job-error"' in response.text and tune_runs[DAG_A].run_id in response.text
    # ... and the page lists it under the run's Ray jobs, linked to that route.
    status = _get(base, token, f"{ray_ml.URL_PREFIX}/status.json").json()
    assert [job["submission_id"] for job in status["jobs"]] == [job_a] and status["jobs_error"]
    assert f'href="jobs/{job_a}"' in _get(base, token, f"{ray_ml.URL_PREFIX}/").text


def test_rollback_from_the_page_is_refused_to_a_user_who_may_not_trigger_the_rollback_dag(page_server):
    """A viewer may read the page but not trigger DAGs: the button's request is refused before Ray is asked."""
    base, passwords = page_server
    serialize_project_dags()
    token = _token(base, "reader_a", passwords["reader_a"])
    response = requests.post(f"{base}{ray_ml.URL_PREFIX}/apps/wine-quality/actions", json={"version": None},
                             headers={"Authorization": f"Bearer {token}", ray_ml.ACTION_HEADER: "1"}, timeout=60)
    # 403 with the DAG named, not the page's "cannot reach Ray" (502): the permission came first
    assert response.status_code == 403, response.text
    assert "may not trigger DAG 'ray_serve_rollback'" in response.json()["detail"]
