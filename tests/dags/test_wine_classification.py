"""Classification end to end: the wine DAG with ``task=classification`` (the grades as classes),
batch scoring with class probabilities, and the same DAG on a generated table that is not wine (a
two-class text label, a categorical feature) with the trigger form's conf and its Deploy fields left
empty, each ending in real HTTP calls. Two classes made from
the grades by ``label_threshold``: the data stage's tests and the Params' (test_wine_params.py)."""

from __future__ import annotations

import glob
import os
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_apps import app_model_version
from tests.conftest import ROOT, allow_sources, load_dag
from tests.dags.wine_runs import ROW, serve_url, states
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration

# the grades' run: a short search over both families; the two-class run tests the labels, not the search
SMALL = {"demo_rows": 1500, "demo_seed": 3, "num_trials": 2, "max_epochs": 3, "num_boost_round": 40,
         "task": "classification"}


def _run(when: datetime, **conf):
    return load_dag("wine_quality_pipeline", ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)


def _predict(endpoint: str, rows: list[dict]) -> dict:
    answer = requests.post(f"{endpoint}/predict", json={"instances": rows}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _check_classifier_run(dag_run, classes: list) -> dict:
    """The run's hand-offs of a classification: classes, the log-loss search, a model better than the class shares."""
    assert dag_run.state == "success", states(dag_run)
    preprocessed = _xcom(dag_run, "preprocess")
    assert preprocessed["task"] == "classification" and preprocessed["classes"] == classes
    tuned = _xcom(dag_run, "tune")
    assert tuned["metric"] == "val_log_loss" and tuned["mode"] == "min"
    model = _xcom(dag_run, "train")
    test = model["metrics"]["test"]
    assert model["classes"] == classes and set(test) == {"log_loss", "accuracy", "macro_f1"}
    assert test["log_loss"] < model["baseline"]["test_log_loss"]
    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["model_version"] == model["model_version"]
    assert deployed["metric"] == "log_loss"
    return deployed


@pytest.fixture(scope="module")
def grades_run(airflow_db, ray_conn, own_serve_apps):
    """The classification pipeline end to end, once; its application serves the module's tests."""
    own_serve_apps.add("wine-grades")
    return _run(datetime(2026, 5, 1, tzinfo=timezone.utc), **SMALL, serve_app="wine-grades",
                serve_route="/wine-grades")


def test_wine_grades_as_classes_are_served_with_their_probabilities(grades_run):
    classes = _xcom(grades_run, "preprocess")["classes"]
    assert set(classes) <= set(range(3, 10)) and len(classes) >= 5 and classes == sorted(classes)
    deployed = _check_classifier_run(grades_run, classes)
    answer = _predict(deployed["endpoint"], [ROW, {**ROW, "alcohol": 13.5, "type": "red"}])
    assert answer["classes"] == classes and all(grade in classes for grade in answer["predictions"])
    for row, grade in zip(answer["probabilities"], answer["predictions"]):
        assert sum(row) == pytest.approx(1, abs=1e-5) and classes[int(np.argmax(row))] == grade


def test_batch_scoring_writes_the_class_and_each_class_probability(grades_run):
    classes = _xcom(grades_run, "preprocess")["classes"]
    when = datetime(2026, 5, 2, tzinfo=timezone.utc)
    dag_run = load_dag("wine_batch_scoring", ROOT / "dags").test(
        logical_date=when, run_after=when, run_conf={"new_rows": 300, "serve_app": "wine-grades"})
    assert dag_run.state == "success", states(dag_run)
    result = _xcom(dag_run, "score")
    assert result["rows"] == 300 and sum(result["predictions"].values()) == 300
    scored = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(os.path.join(result["output_uri"], "*.csv")))])
    probabilities = scored[[f"probability_{grade}" for grade in classes]].to_numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    chosen = np.asarray(classes)[probabilities.argmax(axis=1)]
    assert (scored["predicted_quality"].to_numpy() == chosen).all()


def churn_table(rows: int, seed: int) -> pd.DataFrame:
    """A generated customer table: a text label ``churned`` (yes/no) that depends on the plan, tenure and calls."""
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "pro"], size=rows, p=[0.5, 0.3, 0.2])
    tenure = rng.integers(1, 72, size=rows).astype(float)
    calls = rng.poisson(2.0, size=rows).astype(float)
    charges = np.round(rng.normal(50, 15, size=rows) + np.where(plan == "pro", 30, 0), 2)
    score = 0.9 * (calls - 2) - 0.05 * (tenure - 36) + np.where(plan == "basic", 0.8, -0.4) + rng.normal(0, 1, rows)
    return pd.DataFrame({"plan": plan, "tenure_months": tenure, "support_calls": calls, "monthly_charges": charges,
                         "churned": np.where(score > 0.5, "yes", "no")})


def test_a_table_that_is_not_wine_as_the_form_sends_it_runs_to_a_classifier_served_under_the_label_name(
        airflow_db, ray_conn, tmp_path, monkeypatch, own_serve_apps):
    allow_sources(monkeypatch, tmp_path)  # the table's folder, as an admin widens the allowed sources
    path = tmp_path / "customers.csv"
    table = churn_table(1200, seed=4).rename(columns={"churned": "Churned This Year"})
    table.to_csv(path, index=False)
    dag = load_dag("wine_quality_pipeline", ROOT / "dags")
    # as the trigger form sends it: every Param, the Deploy fields as they start (one typed in and cleared)
    conf = {**{name: param.value for name, param in dag.params.items()}, "source": [str(path)],
            "label_column": "Churned This Year", "task": "classification", "families": ["xgboost"], "num_trials": 1,
            "num_boost_round": 40, "serve_app": ""}
    assert conf["serve_route"] is None and conf["on_schema_change"] == "promote"
    own_serve_apps.add("churned-this-year")
    dag_run = _run(datetime(2026, 5, 4, tzinfo=timezone.utc), **conf)
    deployed = _check_classifier_run(dag_run, ["no", "yes"])
    preprocessed = _xcom(dag_run, "preprocess")
    assert "plan=basic" in preprocessed["feature_columns"]  # the text feature, one-hot encoded
    # the Deploy fields left empty: the application and its route are named after the label
    assert deployed["endpoint"] == f"{serve_url()}/churned-this-year"
    applications = RayHook().get_serve_applications()["applications"]
    assert applications["churned-this-year"]["deployed_app_config"]["route_prefix"] == "/churned-this-year"
    for other in ("wine-quality", "wine-grades"):  # no other application is touched
        served = (applications.get(other) or {}).get("deployed_app_config")
        assert app_model_version(served) != deployed["model_version"], other
    rows = table.drop(columns=["Churned This Year"]).head(20).to_dict(orient="records")
    answer = _predict(deployed["endpoint"], rows)
    assert answer["model_version"] == deployed["model_version"]
    assert answer["classes"] == ["no", "yes"] and set(answer["predictions"]) <= {"no", "yes"}
    np.testing.assert_allclose(np.sum(answer["probabilities"], axis=1), 1, atol=1e-5)
