"""RayServeDeployOperator across a schema change, against a real local Ray cluster: a champion trained
with a column that the challenger's table lacks is never scored; the setting decides, and the decision
is in the note and the serving history.

The champion is the session's good model (``trained_models``); the challenger is the same model
trained on the same files without the column, here; both are served on this module's own application.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.plugins.decision_notes import decision_text
from airflow_ray_ml.serve_history import read_history, serving_dir
from tests.conftest import load_dag, serve_apps_deleted_after_module
from tests.operators.test_ray_job import _xcom
from tests.operators.test_ray_serve import _deploy, _row
from tests.operators.test_ray_serve_rollback import _notes

APP, ROUTE = "wine-schema", "/schema"
REASON = "schema changed: champion needs ['alcohol'], which the challenger's data lacks"
delete_own_serve_apps = serve_apps_deleted_after_module(APP)


@pytest.fixture(scope="module")
def schema_models(trained_models):
    """The full model served to the test's application, and the model of the table without alcohol."""
    when = datetime(2026, 5, 3, tzinfo=timezone.utc)
    dag_run = load_dag("serve_schema_lacking").test(logical_date=when, run_after=when,
                                                    run_conf={"source": trained_models.source})
    assert dag_run.state == "success"
    models = {"full": (trained_models.models["good"], trained_models.data),
              "lacking": (_xcom(dag_run, "train"), _xcom(dag_run, "preprocess"))}
    model, data = models["full"]
    _, state = _deploy("serve_schema", model=model, data=data, on_schema_change="refuse")
    assert state == "success"
    return models


def _served_version() -> str:
    return requests.get(f"{RayHook().serve_url}{ROUTE}/health", timeout=10).json()["model_version"]


def _history() -> list[dict]:
    return read_history(serving_dir(RayHook().artifact_root, APP))


@pytest.mark.integration
def test_deploy_champion_needing_a_column_the_challenger_lacks_decides_by_the_setting(schema_models):
    full, _ = schema_models["full"]
    lacking, lacking_data = schema_models["lacking"]
    assert "alcohol" not in lacking_data["feature_columns"]  # the fixture's premise

    # refuse: the champion stays, the task is skipped (not failed) with the reason in note and history
    refused_run, state = _deploy("serve_schema", model=lacking, data=lacking_data, on_schema_change="refuse")
    assert state == "skipped"
    decision = _xcom(refused_run, "deploy", key="decision")
    assert decision["action"] == "kept_champion" and decision["reason"] == REASON
    assert decision["champion_version"] == full["model_version"] and decision["champion"] is None
    assert _history()[-1]["reason"] == REASON and _history()[-1]["run_id"] == refused_run.run_id
    run_note, task_notes = _notes(refused_run.dag_id, refused_run.run_id)
    assert task_notes["deploy"] == run_note == decision_text(decision) and REASON in run_note
    assert _served_version() == full["model_version"]

    # promote: the challenger is served, and answers rows without the column
    promoted_run, state = _deploy("serve_schema", model=lacking, data=lacking_data, on_schema_change="promote")
    assert state == "success"
    decision = _xcom(promoted_run, "deploy", key="decision")
    assert decision["action"] == "promoted" and decision["reason"] == REASON
    assert _history()[-1]["reason"] == REASON and _history()[-1]["action"] == "promoted"
    run_note, task_notes = _notes(promoted_run.dag_id, promoted_run.run_id)
    assert task_notes["deploy"] == run_note == decision_text(decision) and REASON in run_note
    assert _served_version() == lacking["model_version"]
    row = {column: value for column, value in _row().items() if column != "alcohol"}
    answer = requests.post(f"{RayHook().serve_url}{ROUTE}/predict", json={"instances": [row]}, timeout=10)
    assert answer.status_code == 200 and answer.json()["model_version"] == lacking["model_version"]
    assert [entry["action"] for entry in _history()] == ["promoted", "kept_champion", "promoted"]
