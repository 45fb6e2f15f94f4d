"""The wine DAG end to end (with the stages that exist) through dag.test() on a real Ray cluster."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest

from rayml.specs import ComputeSpec
from tests.conftest import ROOT, load_dag
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration


def test_wine_dag_runs_with_small_params(airflow_db, ray_conn):
    dag = load_dag("wine_quality_pipeline", ROOT / "dags")
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    dag_run = dag.test(logical_date=when, run_after=when, run_conf={"demo_rows": 800, "demo_seed": 1})
    assert dag_run.state == "success"
    compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
    assert compute.use_gpu is False
    data = _xcom(dag_run, "demo_data")
    assert data["rows"] == 800 and sorted(os.path.basename(uri) for uri in data["data_uris"]) == [
        "winequality-red.csv", "winequality-white.csv"]
    preprocessed = _xcom(dag_run, "preprocess")
    assert preprocessed["rows_read"] == 800 and sum(preprocessed["rows"].values()) == 800
    assert preprocessed["fingerprint"] == data["fingerprint"]
    assert set(preprocessed["split_uris"]) == {"train", "validation", "test"}
