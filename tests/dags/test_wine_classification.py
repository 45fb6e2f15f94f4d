"""Classification end to end, once: the wine DAG on a generated table that is not wine (a three-class
text label, a categorical feature) with the trigger form's conf and its Deploy fields left empty, a
short search whose champion is an ensemble of trials, ending in real HTTP calls; then batch scoring of the team's own
file with each class's probability. Integer classes (the wine grades) are served over HTTP in
tests/include/test_serve.py; two classes made from the grades by ``label_threshold``: the data
stage's tests and the Params' (test_wine_params.py)."""

from __future__ import annotations

import glob
import os
from datetime import datetime, timezone
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_apps import app_model_version
from tests.conftest import ROOT, allow_sources, load_dag
from tests.dags.wine_runs import serve_url, states
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration


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


LABEL, APP = "Contract Next Year", "contract-next-year"  # the application is named after the label
CLASSES = ["cancel", "downgrade", "renew"]


def customer_table(rows: int, seed: int) -> pd.DataFrame:
    """A generated customer table: a text label ``Contract Next Year`` (cancel, downgrade or renew) that
    depends on the plan, tenure and support calls."""
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "pro"], size=rows, p=[0.5, 0.3, 0.2])
    tenure = rng.integers(1, 72, size=rows).astype(float)
    calls = rng.poisson(2.0, size=rows).astype(float)
    charges = np.round(rng.normal(50, 15, size=rows) + np.where(plan == "pro", 30, 0), 2)
    risk = 0.9 * (calls - 2) - 0.05 * (tenure - 36) + np.where(plan == "basic", 0.8, -0.4) + rng.normal(0, 1, rows)
    label = np.select([risk > 1.2, risk > -0.2], ["cancel", "downgrade"], "renew")
    return pd.DataFrame({"plan": plan, "tenure_months": tenure, "support_calls": calls, "monthly_charges": charges,
                         LABEL: label})


@pytest.fixture(scope="module")
def classifier_run(airflow_db, ray_conn, tmp_path_factory, own_serve_apps):
    """The pipeline on the customer table as the trigger form sends it, once; its application serves
    the module's tests. The table's folder is an allowed source until the module ends, as an admin
    widens them."""
    folder = tmp_path_factory.mktemp("customers")
    path = folder / "customers.csv"
    table = customer_table(1200, seed=4)
    table.to_csv(path, index=False)
    dag = load_dag("wine_quality_pipeline", ROOT / "dags")
    # as the trigger form sends it: every Param, the Deploy fields as they start (one typed in and cleared)
    conf = {**{name: param.value for name, param in dag.params.items()}, "source": [str(path)],
            "label_column": LABEL, "task": "classification", "num_trials": 3, "max_epochs": 3,
            "num_boost_round": 40, "serve_app": ""}
    assert conf["serve_route"] is None and conf["on_schema_change"] == "promote"
    own_serve_apps.add(APP)
    with pytest.MonkeyPatch.context() as monkeypatch:
        allow_sources(monkeypatch, str(folder))
        dag_run = _run(datetime(2026, 5, 4, tzinfo=timezone.utc), **conf)
        yield SimpleNamespace(dag_run=dag_run, table=table, folder=folder)


def test_a_table_that_is_not_wine_as_the_form_sends_it_runs_to_a_classifier_served_under_the_label_name(
        classifier_run):
    dag_run, table = classifier_run.dag_run, classifier_run.table
    deployed = _check_classifier_run(dag_run, CLASSES)
    # every family in the form, three trials (the start configs: XGBoost and the two forests), and their
    # average beats each of them: the champion is an ensemble whose card lists its members and weights
    model = _xcom(dag_run, "train")
    tuned = _xcom(dag_run, "tune")
    assert model["family"] == "ensemble" == tuned["best_config"]["family"]
    members = model["config"]["members"]
    assert [m["trial_id"] for m in members] == [m["trial_id"] for m in tuned["best_config"]["members"]]
    assert len(members) >= 2 and sum(member["weight"] for member in members) == pytest.approx(1)
    assert {member["family"] for member in members} <= {"xgboost", "extra_trees", "random_forest"}
    assert all(set(member["validation"]) == {"log_loss", "accuracy", "macro_f1"} for member in members)
    preprocessed = _xcom(dag_run, "preprocess")
    assert "plan=basic" in preprocessed["feature_columns"]  # the text feature, one-hot encoded
    # each Ray job's id names the DAG, the label it trains for and the task (the probe ran none: no GPU)
    assert {task: _xcom(dag_run, task, key="ray_job")["submission_id"].rsplit("-", 1)[0]
            for task in ("preprocess", "tune", "train")} == {
        task: f"airflow-wine-quality-pipeline-contract-next-year-{task}" for task in ("preprocess", "tune", "train")}
    # the Deploy fields left empty: the application and its route are named after the label
    assert deployed["endpoint"] == f"{serve_url()}/{APP}"
    applications = RayHook().get_serve_applications()["applications"]
    assert applications[APP]["deployed_app_config"]["route_prefix"] == f"/{APP}"
    served = (applications.get("wine-quality") or {}).get("deployed_app_config")  # no other application is touched
    assert app_model_version(served) != deployed["model_version"]
    rows = table.drop(columns=[LABEL]).head(40).to_dict(orient="records")
    answer = _predict(deployed["endpoint"], rows)
    assert answer["model_version"] == deployed["model_version"]
    assert answer["classes"] == CLASSES and set(answer["predictions"]) <= set(CLASSES)
    assert len(set(answer["predictions"])) > 1
    for row, predicted in zip(answer["probabilities"], answer["predictions"]):
        assert sum(row) == pytest.approx(1, abs=1e-5) and CLASSES[int(np.argmax(row))] == predicted


def test_batch_scoring_of_the_teams_file_writes_the_class_and_each_class_probability(classifier_run):
    new_rows = classifier_run.folder / "next_month.csv"
    customer_table(300, seed=9).drop(columns=[LABEL]).to_csv(new_rows, index=False)
    when = datetime(2026, 5, 5, tzinfo=timezone.utc)  # the folder is an allowed source while the module runs
    dag_run = load_dag("wine_batch_scoring", ROOT / "dags").test(
        logical_date=when, run_after=when, run_conf={"input": str(new_rows), "serve_app": APP})
    assert dag_run.state == "success", states(dag_run)
    assert states(dag_run)["new_wines"] == "skipped"  # the team's file, not generated wines
    result = _xcom(dag_run, "score")
    assert result["rows"] == 300 and sum(result["predictions"].values()) == 300
    assert os.path.dirname(result["output_uri"]) == str(classifier_run.folder)
    scored = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(os.path.join(result["output_uri"], "*.csv")))])
    probabilities = scored[[f"probability_{name}" for name in CLASSES]].to_numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    chosen = np.asarray(CLASSES)[probabilities.argmax(axis=1)]
    assert (scored[f"predicted_{LABEL}"].to_numpy() == chosen).all()
