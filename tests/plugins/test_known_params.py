"""A trigger's conf keys that are not Params of the DAG are refused by the api-server (HTTP 400,
naming them and the Params) on every DAG the project ships; known keys still create their run.

Airflow's api-server runs under uvicorn (all admins) on the test metadata DB holding the project's
serialized DAGs; no scheduler runs, so a run that is created stays queued and is deleted again.
"""

from __future__ import annotations

import pytest
import requests

from tests.conftest import ROOT, dag_bag, serialize_project_dags
from tests.plugins.api_server import running_api_server

pytestmark = pytest.mark.integration

SHIPPED = sorted(dag_bag(ROOT / "dags").dag_ids)


@pytest.fixture(scope="module")
def api_server(airflow_db, tmp_path_factory):
    serialize_project_dags()
    with running_api_server(tmp_path_factory.mktemp("api"),
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        yield base


def _trigger(base: str, dag_id: str, conf: dict) -> requests.Response:
    return requests.post(f"{base}/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf},
                         timeout=30)


def _run_ids(base: str, dag_id: str) -> set[str]:
    response = requests.get(f"{base}/api/v2/dags/{dag_id}/dagRuns", params={"limit": 1000}, timeout=10)
    response.raise_for_status()
    return {run["dag_run_id"] for run in response.json()["dag_runs"]}


def test_the_project_ships_these_dags_each_with_params():
    assert SHIPPED == ["ray_job_example", "ray_serve_rollback", "wine_batch_scoring", "wine_quality_pipeline"]
    assert all(dag_bag(ROOT / "dags").dags[dag_id].params for dag_id in SHIPPED)


@pytest.mark.parametrize("dag_id", SHIPPED)
def test_a_conf_key_that_is_no_param_is_refused_with_the_params_and_no_run(api_server, dag_id):
    params = sorted(dag_bag(ROOT / "dags").dags[dag_id].params)
    before = _run_ids(api_server, dag_id)
    answer = _trigger(api_server, dag_id, {"batch_size": 0, params[0]: None})
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert "['batch_size']" in detail and f"DAG '{dag_id}'" in detail and str(params) in detail, detail
    assert _run_ids(api_server, dag_id) == before


def test_known_keys_still_create_the_run_and_make_run_names_it_as_a_run_from_before(api_server, capsys, monkeypatch):
    from tests.scripts.test_stack import stack

    dag_id = "wine_quality_pipeline"
    before = _run_ids(api_server, dag_id)
    answer = _trigger(api_server, dag_id, {"num_trials": 3, "demo_rows": 500})
    assert answer.status_code == 200, answer.text
    run_id = answer.json()["dag_run_id"]
    try:
        assert answer.json()["conf"] == {"num_trials": 3, "demo_rows": 500}
        assert _run_ids(api_server, dag_id) == before | {run_id}
        # `make run` names such a run, queued before its own, which would wait for it (scripts/stack.py)
        monkeypatch.setattr(stack, "AIRFLOW_URL", api_server)  # every user is an admin here: no login
        assert run_id in stack.report_runs_from_before(stack.AirflowClient())
        assert f"run from before is queued: {run_id}" in capsys.readouterr().out
    finally:
        requests.delete(f"{api_server}/api/v2/dags/{dag_id}/dagRuns/{run_id}", timeout=10).raise_for_status()
    # Airflow's own check of a Param's value still answers for a known key
    assert _trigger(api_server, dag_id, {"num_trials": "many"}).status_code == 400
