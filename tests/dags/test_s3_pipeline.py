"""The wine DAGs on a two-node Ray cluster that shares no disk, with the artifact root on a real
S3-compatible server (SeaweedFS on loopback).

The nodes have separate temp dirs and no common artifact path: every split, preprocessor, Tune
result, checkpoint, model directory, manifest and the serving history live in the bucket, and
the Serve replicas load the model from there. Airflow reaches the bucket through an ``aws``
connection named by the ``ray_ml`` connection's ``storage_conn_id``; the Ray nodes through their
own environment (the cluster's identity). The secret must never reach a task log, a job's
entrypoint or runtime_env, the job metadata or the Serve config that Ray's APIs return.
"""

from __future__ import annotations

import io
import json
import os
from datetime import datetime, timezone

import pandas as pd
import pytest
import requests

from airflow_ray_ml_stages import artifacts
from tests.child import run_python
from tests.conftest import ROOT, TEST_CLUSTER_ENV, load_dag, run_dir
from tests.dags.wine_runs import ONE_TRIAL, ROW, WORSE, states
from tests.operators.test_ray_job import _xcom

pytestmark = [pytest.mark.integration, pytest.mark.s3]

STORAGE_CONN = "rayml_test_s3"


def _run(dag_id: str, when: datetime, **conf):
    dag_run = load_dag(dag_id, ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)
    assert dag_run.state == "success", states(dag_run)
    return dag_run


@pytest.fixture(scope="module")
def s3_cluster(s3_server):
    """Two Ray nodes, each with its own temp dir and the S3 server's credentials in its environment."""
    from scripts.localcluster import LocalRayCluster, new_token

    cluster = LocalRayCluster(temp_dir=run_dir("rh"), num_cpus=2, num_gpus=0,
                              token=new_token(), extra_env={**TEST_CLUSTER_ENV, **s3_server.env})
    try:
        cluster.start()
        cluster.add_node(num_cpus=2, num_gpus=0, temp_dir=run_dir("rn"))
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def on_s3(airflow_db, s3_server, s3_cluster, monkeypatch):
    """Point ``ray_default`` at the two-node cluster with an s3:// artifact root; Airflow's own
    environment has no AWS credentials, so only the storage connection can open the bucket."""
    from scripts.localcluster import free_port

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    root = f"s3://{s3_server.bucket}/ml"
    monkeypatch.setenv(f"AIRFLOW_CONN_{STORAGE_CONN.upper()}", json.dumps({
        "conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
        "extra": {"endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"},
    }))
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({
        "conn_type": "ray_ml",
        "extra": {"dashboard_url": s3_cluster.dashboard_url, "auth_token": s3_cluster.token,
                  "artifact_root": root, "serve_url": f"http://127.0.0.1:{free_port()}",
                  "storage_conn_id": STORAGE_CONN},
    }))
    yield root
    artifacts.forget_s3_credentials()  # the hook gave this process the connection's credentials


# The "Ray ML" page as a fresh api-server process runs it: nothing there has read the connection yet.
PAGE_IN_A_FRESH_PROCESS = """
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow_ray_ml.plugins import ray_ml

create_auth_manager()
user = SimpleAuthManagerUser(username="admin", role="admin")
png = ray_ml.plot_bytes(user)
data = ray_ml.PageData(conn_id=ray_ml.ray_conn_id())
ray_ml.load_tune(data, user)
report({"png_bytes": len(png), "rows": len(data.tune.rows or []), "error": data.tune.leaderboard_error})
"""


def _health(endpoint: str) -> str:
    return requests.get(f"{endpoint}/health", timeout=10).json()["model_version"]


def test_both_dags_and_a_rollback_on_two_nodes_with_the_artifacts_on_s3(on_s3, s3_server, s3_cluster, capfd):
    from airflow_ray_ml.hooks.ray import RayHook

    # 1. a weak first model (nothing is served yet, so it is promoted), trained on both nodes: one
    #    training worker on each (the suite's only multi-node training run)
    first = _run("wine_quality_pipeline", datetime(2026, 6, 1, tzinfo=timezone.utc),
                 **{**ONE_TRIAL, "search_space": WORSE, "train_workers": 2, "placement_strategy": "STRICT_SPREAD"})
    used = _xcom(first, "train")["compute_used"]
    assert used["num_workers"] == 2 and used["placement_strategy"] == "STRICT_SPREAD"
    assert set(used["worker_nodes"]) == {node["node_id"] for node in s3_cluster.nodes()}
    first_version = _xcom(first, "train")["model_version"]
    endpoint = _xcom(first, "deploy", key="serve_endpoint")["endpoint"]
    assert _health(endpoint) == first_version

    # 2. a better one, trained on other data (another demo seed), replaces it. The gate scored the
    #    champion over HTTP on this run's test split, not by the metric its card kept; the answer
    #    comes from the model the replica loaded from the bucket
    #    It is an ensemble (of its two trials, XGBoost and ExtraTrees, or the better one's fold models: its 225
    #    validation rows are cross-validated), assembled and served from the bucket
    second = _run("wine_quality_pipeline", datetime(2026, 6, 2, tzinfo=timezone.utc),
                  **{**ONE_TRIAL, "demo_seed": 2, "num_trials": 2, "families": ["xgboost", "extra_trees"],
                     "cv_folds": 5})
    second_version = _xcom(second, "train")["model_version"]
    assert _xcom(second, "train")["family"] == "ensemble"
    assert _xcom(second, "preprocess")["fingerprint"] != _xcom(first, "preprocess")["fingerprint"]
    decision = _xcom(second, "deploy", key="decision")
    assert decision["action"] == "promoted" and decision["champion_version"] == first_version
    assert decision["champion"] != pytest.approx(_xcom(first, "train")["metrics"]["test"]["rmse"], abs=1e-9)
    assert decision["challenger"] < decision["champion"]
    answer = requests.post(f"{endpoint}/predict", json={"instances": [ROW]}, timeout=30)
    assert answer.status_code == 200 and answer.json()["model_version"] == second_version

    # every artifact is an object in the bucket, and nothing was written to a local artifact root
    model_dir = _xcom(second, "train")["model_dir"]
    assert model_dir.startswith(f"{on_s3}/wine_quality_pipeline/")
    keys = s3_server.keys("ml")
    bucket_root = on_s3[len("s3://"):]
    for what in ("/preprocess/manifest.json", "/tune/manifest.json", "/train/manifest.json",
                 "/preprocess/splits/", ".json", "/tune/"):
        assert any(what in key for key in keys), what
    assert any(key.startswith(model_dir[len("s3://"):] + "/") for key in keys)
    assert any(key.startswith(model_dir[len("s3://"):] + "/members/1/") for key in keys)  # the ensemble's members
    tune_dir = _xcom(second, "tune")["artifact_dir"][len("s3://"):]
    for fold in range(5):  # the cross-validation folds, written and read in the bucket
        assert f"{tune_dir}/folds/{fold}/train.parquet" in keys and f"{tune_dir}/folds/{fold}/validation.parquet" in keys
    for name in ("history.json", "previous_config.json", f"configs/{second_version}.json"):
        assert f"{bucket_root}/serving/wine-quality/{name}" in keys, name
    assert any(key.startswith(f"{bucket_root}/serving/wine-quality/code/") for key in keys)
    from airflow_ray_ml.ray_job import DEFAULT_ARTIFACT_ROOT

    assert not os.path.exists(os.path.join(DEFAULT_ARTIFACT_ROOT, "wine_quality_pipeline"))

    # 3. batch scoring reads the served model and writes its output into the bucket
    scoring = _run("wine_batch_scoring", datetime(2026, 6, 3, tzinfo=timezone.utc), new_rows=300)
    result = _xcom(scoring, "score")
    assert result["output_uri"].startswith(f"{on_s3}/") and result["model_version"] == second_version
    filesystem = s3_server.filesystem()
    parts = [key for key in s3_server.keys(result["output_uri"][len(f"s3://{s3_server.bucket}/"):])
             if key.endswith(".csv")]
    scored = pd.concat([pd.read_csv(io.BytesIO(filesystem.open_input_stream(key).read())) for key in parts])
    assert len(scored) == 300 and scored["predicted_quality"].between(0, 10).all()

    # 4. a rollback from the ensemble restores the first model from the config its promotion kept in the bucket
    _run("ray_serve_rollback", datetime(2026, 6, 4, tzinfo=timezone.utc), app_name="wine-quality",
         reason="s3 test")
    assert _health(endpoint) == first_version
    history = artifacts.read_json(f"{on_s3}/serving/wine-quality/history.json")
    assert history[-1]["action"] == "rollback" and history[-1]["version"] == first_version

    # 5. the page reads the Tune run's plot and leaderboard from the bucket with the storage connection
    shown = run_python(PAGE_IN_A_FRESH_PROCESS, timeout=120).result
    assert shown["png_bytes"] > 1000 and shown["rows"] >= 1 and shown["error"] is None, shown

    # 6. the secret is nowhere Ray or Airflow show it
    logs = capfd.readouterr()
    assert "[ray] " in logs.out  # the jobs' logs were streamed into the task logs captured here
    assert s3_server.secret_key not in logs.out + logs.err
    hook = RayHook()
    jobs = hook.list_jobs()
    assert len(jobs) >= 10
    assert s3_server.secret_key not in json.dumps(jobs)
    assert s3_server.secret_key not in json.dumps(hook.get_serve_applications())
    log_files = [os.path.join(folder, name) for folder, _, names in os.walk(os.environ["AIRFLOW_HOME"])
                 for name in names if name.endswith(".log")]
    for path in log_files:
        with open(path, errors="replace") as handle:
            assert s3_server.secret_key not in handle.read(), path
