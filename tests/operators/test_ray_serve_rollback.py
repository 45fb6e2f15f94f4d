"""Rollback and pin of a served model, started from the "Ray ML" page as runs of the rollback DAG,
and the decisions of deploys and rollbacks as task and run notes.

Real pieces throughout: the session's models (``trained_models``, trained as Ray jobs on its local
cluster), deployed by the real deploy operator to this module's own application, Airflow's
api-server (with the page) and a scheduler with the LocalExecutor on the test metadata DB, and HTTP
calls to the endpoint to see which model answers.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
import requests
from airflow.exceptions import ParamValidationError
from airflow.sdk import DAG

from airflow_ray_ml.errors import InvalidSpecError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.plugins.decision_notes import decision_text
from airflow_ray_ml.serve_history import history_uri, serving_dir
from airflow_ray_ml.ray_serve_rollback import RayServeRollbackOperator, RollbackError, check_version, previous_version
from airflow_ray_ml_stages import artifacts
from tests.conftest import ROOT, load_dag, serialize_project_dags, serve_apps_deleted_after_module
from tests.dags.wine_conf import trigger_params
from tests.plugins.api_server import running_api_server
from tests.scheduler import running_scheduler

APP, ROUTE = "wine-rollback", "/rollback"
ROLLBACK_DAG = "ray_serve_rollback"
_RUNS = iter(range(1, 1000))
delete_own_serve_apps = serve_apps_deleted_after_module(APP)


def _promoted(*versions: str) -> list[dict]:
    return [{"action": "promoted", "challenger_version": version} for version in versions]


# -- which model a rollback serves ----------------------------------------------------------------


def test_previous_version_walks_back_the_promotions_not_the_pins_or_kept_champions():
    history = [*_promoted("a", "b"), {"action": "kept_champion", "challenger_version": "x"},
               *_promoted("c"), {"action": "rollback", "version": "b", "from_version": "c"}]
    assert previous_version(history, "c") == "b"
    assert previous_version(history, "b") == "a"  # a second rollback goes one further back


@pytest.mark.parametrize(("history", "live", "message"), [
    ([], "a", "nothing was ever promoted"),
    (_promoted("a", "b"), "a", "first model promoted"),
    (_promoted("a", "b"), "zz", "was not promoted by a deploy"),
    (_promoted("a", "b"), None, "serves no model now"),
])
def test_previous_version_without_an_earlier_model_says_what_to_do(history, live, message):
    with pytest.raises(RollbackError, match=message):
        previous_version(history, live)


@pytest.mark.parametrize("version", ["../etc", "a b", "x" * 200, "-lead"])
def test_check_version_refuses_what_is_not_a_version(version):
    with pytest.raises(RollbackError, match="must be a model version"):
        check_version(version)


def test_check_version_empty_means_the_previous_model():
    assert check_version("") is None and check_version(None) is None
    assert check_version("xgboost-20260601T120000-ab12cd") == "xgboost-20260601T120000-ab12cd"


def test_decision_text_says_what_was_decided_with_versions_metrics_and_why():
    kept = decision_text({"action": "kept_champion", "challenger_version": "v2", "champion_version": "v1",
                          "metric": "rmse", "challenger": 0.681, "champion": 0.6579,
                          "reason": "challenger rmse 0.6810 vs champion 0.6579 (needs 0 better)"})
    assert kept == "Kept champion v1; challenger v2 not promoted: challenger rmse 0.6810 vs champion 0.6579 (needs 0 better)"
    first = decision_text({"action": "promoted", "challenger_version": "v1", "champion_version": None,
                           "metric": "rmse", "challenger": 0.7, "champion": None, "reason": "nothing is served yet"})
    assert first == "Promoted v1: nothing is served yet (test rmse 0.7000)"
    back = decision_text({"action": "rollback", "version": "v1", "from_version": "v2", "reason": "asked by admin"})
    assert back == "Rolled back from v2 to v1: asked by admin"


def test_rollback_dag_refuses_a_run_that_names_no_application():
    """A rollback runs in its own DAG, not the deploying one: nothing there says which application, so
    the trigger needs one (the page always sends it)."""
    dag = load_dag(ROLLBACK_DAG, ROOT / "dags")
    with pytest.raises((ParamValidationError, ValueError), match="app_name"):  # Airflow 3.2: ValueError
        trigger_params(dag, {})
    assert trigger_params(dag, {"app_name": "sales_forecast"})["app_name"] == "sales_forecast"


@pytest.mark.parametrize("app_name", ["", "None"])
def test_rollback_operator_with_an_empty_app_name_says_it_is_required(app_name):
    with DAG(dag_id="rollback_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        task = RayServeRollbackOperator(task_id="serve_again", app_name=app_name)
    with pytest.raises(InvalidSpecError, match=r"app_name is required: the Serve application to change"):
        task.check_app_name()


# -- on a real cluster ------------------------------------------------------------------------------


def _deploy(**conf):
    when = datetime(2026, 8, 1, tzinfo=timezone.utc) + timedelta(hours=next(_RUNS))
    dag_run = load_dag("serve_deploy_rollback").test(logical_date=when, run_after=when, run_conf=conf)
    return dag_run, {ti.task_id: ti for ti in dag_run.get_task_instances()}["deploy"]


def _served_version() -> str:
    return requests.get(f"{RayHook().serve_url}{ROUTE}/health", timeout=10).json()["model_version"]


def _history() -> list[dict]:
    return artifacts.read_json(history_uri(serving_dir(RayHook().artifact_root, APP)))


def _notes(dag_id: str, run_id: str) -> tuple[str | None, dict[str, str | None]]:
    """The run's note and each task's note, as the metadata DB holds them."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        return run.note, {ti.task_id: ti.note for ti in run.get_task_instances(session=session)}


@pytest.fixture(scope="module")
def served(trained_models):
    """The session's three models (worse < good < better) and their split; good then better promoted
    to this module's application."""
    trained, data = trained_models.models, trained_models.data
    for name in ("good", "better"):
        _, deploy = _deploy(model=trained[name], data=data)
        assert deploy.state == "success", name
    assert _served_version() == trained["better"]["model_version"]
    return trained, data


@pytest.mark.integration
def test_kept_champion_deploy_carries_its_reason_in_the_task_and_run_notes(served):
    trained, data = served
    dag_run, deploy = _deploy(model=trained["worse"], data=data)
    assert deploy.state == "skipped"
    run_note, task_notes = _notes(dag_run.dag_id, dag_run.run_id)
    decision = _history()[-1]
    assert decision["action"] == "kept_champion"
    expected = decision_text(decision)
    assert task_notes["deploy"] == expected and run_note == expected
    assert expected.startswith(f"Kept champion {trained['better']['model_version']}; challenger "
                               f"{trained['worse']['model_version']} not promoted: challenger rmse "
                               f"{decision['challenger']:.4f} vs champion {decision['champion']:.4f}")


def _wait_for_run(base: str, run_id: str, log_dir, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            run = requests.get(f"{base}/api/v2/dags/{ROLLBACK_DAG}/dagRuns/{run_id}", timeout=10).json()
        except requests.Timeout:  # the API server busy (a loaded 2-core machine): ask again within the deadline
            continue
        if run.get("state") in ("success", "failed"):
            return run
        time.sleep(1)
    raise AssertionError(f"run {run_id} did not finish in {timeout_s:.0f} s; the scheduler's log ends:\n"
                         f"{(log_dir / 'scheduler.log').read_text()[-3000:]}")


def _ask(base: str, version: str | None) -> requests.Response:
    return requests.post(f"{base}/ray-ml/apps/{APP}/actions", json={"version": version},
                         headers={"X-Ray-ML-Action": "1"}, timeout=60)


@pytest.mark.integration
def test_rollback_and_pin_from_the_page_run_as_dag_runs_and_change_the_served_model(served, tmp_path):
    trained, _ = served
    good, better = trained["good"]["model_version"], trained["better"]["model_version"]
    # The rollback DAG must be in Airflow's DB for the page to trigger it and the scheduler to run it.
    serialize_project_dags()
    secret = "rollback-test-jwt-secret"
    with running_api_server(tmp_path, AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
                            AIRFLOW__API_AUTH__JWT_SECRET=secret) as base, \
            running_scheduler(tmp_path / "scheduler.log", ROLLBACK_DAG, base, AIRFLOW__API_AUTH__JWT_SECRET=secret):
        # A cross-site form cannot send the header: without it nothing is triggered.
        refused = requests.post(f"{base}/ray-ml/apps/{APP}/actions", json={"version": None}, timeout=30)
        assert refused.status_code == 403, refused.text

        answer = _ask(base, None)
        assert answer.status_code == 201, answer.text
        started = answer.json()
        assert started["dag_id"] == ROLLBACK_DAG and started["version"] == good
        run = _wait_for_run(base, started["run_id"], tmp_path)
        assert run["state"] == "success", run
        assert _served_version() == good  # the endpoint answers with the previous model
        entry = _history()[-1]
        assert (entry["action"], entry["version"], entry["from_version"]) == ("rollback", good, better)
        assert entry["dag_id"] == ROLLBACK_DAG and entry["run_id"] == started["run_id"]
        run_note, task_notes = _notes(ROLLBACK_DAG, started["run_id"])
        assert task_notes["serve_again"] == decision_text(entry)
        assert "roll back" in run_note  # the note the page gave the run when it triggered it

        # good is the first model promoted: a second rollback is refused before any run starts.
        before = requests.get(f"{base}/api/v2/dags/{ROLLBACK_DAG}/dagRuns", timeout=10).json()["total_entries"]
        again = _ask(base, None)
        assert again.status_code == 409 and "first model promoted" in again.json()["detail"]
        unknown = _ask(base, "xgboost-never-promoted")
        assert unknown.status_code == 404 and "never promoted" in unknown.json()["detail"]
        after = requests.get(f"{base}/api/v2/dags/{ROLLBACK_DAG}/dagRuns", timeout=10).json()["total_entries"]
        assert after == before

        # Pin the better model again.
        pinned = _ask(base, better)
        assert pinned.status_code == 201, pinned.text
        assert _wait_for_run(base, pinned.json()["run_id"], tmp_path)["state"] == "success"
        assert _served_version() == better
        assert _history()[-1]["action"] == "pinned"
