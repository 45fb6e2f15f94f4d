"""The wine DAG end to end (with the stages that exist) through dag.test() on a real Ray cluster."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
import requests

from rayml.specs import ComputeSpec
from tests.conftest import ROOT, load_dag
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration


def test_wine_dag_runs_with_small_params(airflow_db, ray_conn):
    dag = load_dag("wine_quality_pipeline", ROOT / "dags")
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    conf = {"demo_rows": 1500, "demo_seed": 1, "family": "xgboost", "num_boost_round": 40}
    dag_run = dag.test(logical_date=when, run_after=when, run_conf=conf)
    assert dag_run.state == "success"
    compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
    assert compute.use_gpu is False
    data = _xcom(dag_run, "demo_data")
    assert data["rows"] == 1500 and sorted(os.path.basename(uri) for uri in data["data_uris"]) == [
        "winequality-red.csv", "winequality-white.csv"]
    preprocessed = _xcom(dag_run, "preprocess")
    assert preprocessed["rows_read"] == 1500 and sum(preprocessed["rows"].values()) == 1500
    assert preprocessed["fingerprint"] == data["fingerprint"]
    assert set(preprocessed["split_uris"]) == {"train", "validation", "test"}
    model = _xcom(dag_run, "train")
    assert model["family"] == "xgboost"
    assert model["metrics"]["test"]["rmse"] < model["baseline"]["test_rmse"]
    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["model_version"] == model["model_version"]
    row = {"fixed acidity": 7.0, "volatile acidity": 0.27, "citric acid": 0.36, "residual sugar": 20.7,
           "chlorides": 0.045, "free sulfur dioxide": 45.0, "total sulfur dioxide": 170.0, "density": 1.001,
           "pH": 3.0, "sulphates": 0.45, "alcohol": 8.8, "type": "white"}
    answer = requests.post(f"{deployed['endpoint']}/predict", json={"instances": [row]}, timeout=30)
    assert answer.status_code == 200
    assert answer.json()["model_version"] == model["model_version"]
    assert 3 <= answer.json()["predictions"][0] <= 9
