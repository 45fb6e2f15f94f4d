"""The wine DAGs end to end through dag.test() on real local Ray clusters, ending in real HTTP calls."""

from __future__ import annotations

import glob
import json
import os
from datetime import datetime, timezone

import pandas as pd
import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_apps import app_model_version
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.specs import ComputeSpec
from tests.conftest import ROOT, allow_sources, extra_cluster, load_dag, serve_apps_deleted_after_module
from tests.operators.test_ray_job import _xcom
from tests.scripts.test_stack import write_rent_table

pytestmark = pytest.mark.integration
delete_own_serve_apps = serve_apps_deleted_after_module("wine-quality", "monthly-rent")

ROW = {"fixed acidity": 7.0, "volatile acidity": 0.27, "citric acid": 0.36, "residual sugar": 20.7,
       "chlorides": 0.045, "free sulfur dioxide": 45.0, "total sulfur dioxide": 170.0, "density": 1.001,
       "pH": 3.0, "sulphates": 0.45, "alcohol": 8.8, "type": "white"}
# small settings: a short search over both families and both scalers
SMALL = {"demo_rows": 1500, "demo_seed": 1, "num_trials": 3, "max_epochs": 2, "num_boost_round": 40}
# what the two-node and the kept-champion runs need of the search: one quick XGBoost trial
ONE_TRIAL = {"demo_rows": 1500, "demo_seed": 1, "num_trials": 1, "families": ["xgboost"], "num_boost_round": 40}


def _run(dag_id: str, when: datetime, **conf):
    return load_dag(dag_id, ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)


def _states(dag_run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def _asset_events(name: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.name == name).order_by(AssetEvent.id).all())
        return [dict(row.extra or {}) for row in rows]


def _serve_url() -> str:
    return json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])["extra"]["serve_url"]


@pytest.fixture(scope="module")
def first_run(airflow_db, ray_conn):
    """The module's first pipeline run: its model is the champion that the later runs meet, whichever
    of these tests runs first."""
    return _run("wine_quality_pipeline", datetime(2026, 4, 1, tzinfo=timezone.utc), **SMALL, require_gpu=False)


def test_wine_dag_runs_with_small_params(first_run):
    # Five operators handing on XComArgs, Params as text: no native rendering, and a templated
    # require_gpu that renders as "False" (truthy as text) must let the CPU-only cluster through.
    assert not load_dag("wine_quality_pipeline", ROOT / "dags").render_template_as_native_obj
    dag_run = first_run
    assert dag_run.state == "success", _states(dag_run)
    compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
    assert compute.use_gpu is False
    data = _xcom(dag_run, "demo_data")
    assert data["rows"] == 1500 and sorted(os.path.basename(uri) for uri in data["data_uris"]) == [
        "winequality-red.csv", "winequality-white.csv"]
    preprocessed = _xcom(dag_run, "preprocess")
    assert preprocessed["rows_read"] == 1500 and sum(preprocessed["rows"].values()) == 1500
    assert preprocessed["fingerprint"] == data["fingerprint"]
    assert set(preprocessed["split_uris"]) == {"train", "validation", "test"}
    tuned = _xcom(dag_run, "tune")
    assert tuned["trials"]["total"] == 3 and tuned["trials"]["completed"] >= 1
    leaderboard = artifacts.read_json(tuned["leaderboard_json_uri"])
    assert leaderboard[0]["trial_id"] == tuned["best_trial_id"] and len(leaderboard) == 3
    model = _xcom(dag_run, "train")
    # train fits tune's best config as is: same family, scaler and hyperparameters
    assert model["family"] == tuned["best_config"]["family"]
    assert {k: model["config"][k] for k in tuned["best_config"] if k in model["config"]} == {
        k: v for k, v in tuned["best_config"].items() if k in model["config"]}
    assert model["metrics"]["test"]["rmse"] < model["baseline"]["test_rmse"]
    assert model["compute_used"]["device_reason"].startswith("CPU: the probe found no usable GPU")
    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["model_version"] == model["model_version"]
    answer = requests.post(f"{deployed['endpoint']}/predict", json={"instances": [ROW]}, timeout=30)
    assert answer.status_code == 200
    assert answer.json()["model_version"] == model["model_version"]
    assert 3 <= answer.json()["predictions"][0] <= 9
    # the promotion is an event of the model Asset, carrying the model's URI and test metrics
    (event,) = [e for e in _asset_events("wine_quality_model") if e.get("model_version") == model["model_version"]]
    assert event["model_version"] == model["model_version"] and event["model_dir"] == model["model_dir"]
    assert event["metrics"] == pytest.approx(model["metrics"]["test"])


def test_second_run_with_a_worse_model_keeps_the_champion(first_run):
    served = requests.get(f"{_serve_url()}/wine/health", timeout=10).json()["model_version"]
    events_before = len(_asset_events("wine_quality_model"))
    # a deliberately worse search: one trial of one shallow boosting round on the same data
    worse = {"family": "xgboost", "scaler": "standard", "xgboost": {"num_boost_round": 1, "max_depth": 1}}
    dag_run = _run("wine_quality_pipeline", datetime(2026, 4, 2, tzinfo=timezone.utc),
                   **{**ONE_TRIAL, "search_space": worse})
    states = _states(dag_run)
    assert states["train"] == "success" and states["deploy"] == "skipped", states
    decision = _xcom(dag_run, "deploy", key="decision")
    assert decision["action"] == "kept_champion" and decision["champion_version"] == served
    assert decision["challenger"] > decision["champion"]
    health = requests.get(f"{_xcom(dag_run, 'deploy', key='serve_endpoint')['endpoint']}/health", timeout=10)
    assert health.json()["model_version"] == served
    assert len(_asset_events("wine_quality_model")) == events_before  # no event: scoring does not rerun


def test_batch_scoring_dag_scores_new_wines_with_the_served_model(first_run):
    served = requests.get(f"{_serve_url()}/wine/health", timeout=10).json()["model_version"]
    dag_run = _run("wine_batch_scoring", datetime(2026, 4, 3, tzinfo=timezone.utc), new_rows=400)
    assert dag_run.state == "success", _states(dag_run)
    result = _xcom(dag_run, "score")
    new_wines = _xcom(dag_run, "new_wines")["data_uris"][0]
    assert os.path.dirname(result["output_uri"]) == os.path.dirname(new_wines)
    assert result["model_version"] == served and result["rows"] == 400
    scored = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(os.path.join(result["output_uri"], "*.csv")))])
    assert len(scored) == 400 and scored["predicted_quality"].between(0, 10).all()
    assert "quality" not in scored.columns


def test_a_champion_from_other_data_is_scored_live_on_the_new_test_split(first_run):
    card = requests.get(f"{_serve_url()}/wine/metadata", timeout=10).json()
    # other data (another demo seed: another fingerprint), and a deliberately worse search again
    worse = {"family": "xgboost", "scaler": "standard", "xgboost": {"num_boost_round": 1, "max_depth": 1}}
    dag_run = _run("wine_quality_pipeline", datetime(2026, 4, 5, tzinfo=timezone.utc),
                   **{**ONE_TRIAL, "demo_seed": 2, "search_space": worse})
    states = _states(dag_run)
    assert states["deploy"] == "skipped", states
    assert _xcom(dag_run, "preprocess")["fingerprint"] != card["data_fingerprint"]
    decision = _xcom(dag_run, "deploy", key="decision")
    assert decision["champion_version"] == card["model_version"]
    # the champion's metric was measured over HTTP on this run's test split, not read from its card
    assert decision["champion"] != pytest.approx(card["metrics"]["test"]["rmse"], abs=1e-9)
    assert 0.3 < decision["champion"] < decision["challenger"]


def test_wine_dag_on_a_two_node_cluster_trains_across_both_nodes(airflow_db, ray_conn, monkeypatch, tmp_path):
    from scripts.localcluster import free_port

    with extra_cluster("ray_two_node", num_cpus=2) as cluster:
        cluster.add_node(num_cpus=2, num_gpus=0)
        node_ids = {node["node_id"] for node in cluster.nodes()}
        assert len(node_ids) == 2
        monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps({
            "conn_type": "ray_ml",
            "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token,
                      "artifact_root": str(tmp_path), "serve_url": f"http://127.0.0.1:{free_port()}"},
        }))
        dag_run = _run("wine_quality_pipeline", datetime(2026, 4, 4, tzinfo=timezone.utc),
                       **{**ONE_TRIAL, "train_workers": 2, "placement_strategy": "STRICT_SPREAD"})
        assert dag_run.state == "success", _states(dag_run)
        used = _xcom(dag_run, "train")["compute_used"]
        assert used["num_workers"] == 2 and used["placement_strategy"] == "STRICT_SPREAD"
        assert set(used["worker_nodes"]) == node_ids  # one training worker on each node
        deployed = _xcom(dag_run, "deploy")
        answer = requests.post(f"{deployed['endpoint']}/predict", json={"instances": [ROW]}, timeout=30)
        assert answer.status_code == 200


def test_wine_form_run_on_another_label_with_default_deploy_fields_serves_under_the_label_name(
        airflow_db, ray_conn, tmp_path, monkeypatch):
    table = pd.read_csv(write_rent_table(tmp_path / "rent.csv", rows=800))
    source = tmp_path / "flats.csv"
    allow_sources(monkeypatch, tmp_path)  # the table's folder, as an admin widens the allowed sources
    table.rename(columns={"rent": "Monthly Rent"}).to_csv(source, index=False)
    dag = load_dag("wine_quality_pipeline", ROOT / "dags")
    # as the trigger form sends it: every Param, the Deploy fields as they start (one typed in and cleared)
    conf = {**{name: param.value for name, param in dag.params.items()}, "source": [str(source)],
            "label_column": "Monthly Rent", "families": ["xgboost"], "num_trials": 1, "num_boost_round": 40,
            "serve_app": ""}
    assert conf["serve_route"] is None and conf["on_schema_change"] == "promote"
    dag_run = _run("wine_quality_pipeline", datetime(2026, 4, 9, tzinfo=timezone.utc), **conf)
    assert dag_run.state == "success", _states(dag_run)

    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["endpoint"] == f"{_serve_url()}/monthly-rent"
    applications = RayHook().get_serve_applications()["applications"]
    assert applications["monthly-rent"]["deployed_app_config"]["route_prefix"] == "/monthly-rent"
    wine = (applications.get("wine-quality") or {}).get("deployed_app_config")
    assert app_model_version(wine) != deployed["model_version"]  # the wine application is not touched
    row = {"sqm": 70.0, "rooms": 3, "year_built": 1990, "district": "centre"}
    answer = requests.post(f"{deployed['endpoint']}/predict", json={"instances": [row]}, timeout=10)
    assert answer.status_code == 200 and answer.json()["model_version"] == deployed["model_version"]
