"""The wine DAGs end to end through dag.test() on the session's Ray cluster, ending in real HTTP calls.

The regression pipeline and its batch scoring run once (``wine_regression``,
tests/dags/conftest.py); each test here asserts one behaviour from them. The pipeline on a table
that is not wine, as the trigger form sends it: test_wine_classification.py; on two nodes, and
against a served champion on other data: test_s3_pipeline.py.
"""

from __future__ import annotations

import glob
import os

import pandas as pd
import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.specs import ComputeSpec
from tests.conftest import ROOT, load_dag
from tests.dags.wine_runs import asset_events
from tests.operators.test_ray_job import _xcom

pytestmark = pytest.mark.integration


def test_wine_dag_runs_with_small_params(wine_regression):
    # Five operators handing on XComArgs, Params as text: no native rendering, and a templated
    # require_gpu that renders as "False" (truthy as text) must let the CPU-only cluster through.
    assert not load_dag("wine_quality_pipeline", ROOT / "dags").render_template_as_native_obj
    dag_run = wine_regression.pipeline
    assert dag_run.state == "success", dag_run.states
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
    assert leaderboard[0]["trial_id"] == tuned["best_trial_id"]
    assert len([row for row in leaderboard if row["trial_id"] != "ensemble"]) == 3  # and the ensemble where it wins
    model = _xcom(dag_run, "train")
    # train fits tune's best config as is: same family, scaler and hyperparameters, or the same members and
    # weights of an ensemble
    assert model["family"] == tuned["best_config"]["family"]
    if model["family"] == "ensemble":
        assert [(m["trial_id"], m["weight"]) for m in model["config"]["members"]] == [
            (m["trial_id"], pytest.approx(m["weight"])) for m in tuned["best_config"]["members"]]
    else:
        assert {k: model["config"][k] for k in tuned["best_config"] if k in model["config"]} == {
            k: v for k, v in tuned["best_config"].items() if k in model["config"]}
    assert model["metrics"]["test"]["rmse"] < model["baseline"]["test_rmse"]
    assert model["compute_used"]["device_reason"].startswith(
        "CPU: an ensemble" if model["family"] == "ensemble" else "CPU: the probe found no usable GPU")
    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["model_version"] == model["model_version"]
    assert deployed["endpoint"] == wine_regression.endpoint  # the Deploy Params as they start: /wine
    answer = wine_regression.answer
    assert answer.status_code == 200
    assert answer.json()["model_version"] == model["model_version"]
    assert 3 <= answer.json()["predictions"][0] <= 9
    # the promotion is an event of the model Asset, carrying the model's URI and test metrics
    (event,) = [e for e in asset_events("wine_quality_model") if e.get("model_version") == model["model_version"]]
    assert event["model_dir"] == model["model_dir"]
    assert event["metrics"] == pytest.approx(model["metrics"]["test"])


def test_batch_scoring_dag_scores_new_wines_with_the_served_model(wine_regression):
    dag_run = wine_regression.scoring
    assert dag_run.state == "success", dag_run.states
    result = _xcom(dag_run, "score")
    new_wines = _xcom(dag_run, "new_wines")["data_uris"][0]
    assert os.path.dirname(result["output_uri"]) == os.path.dirname(new_wines)
    assert result["model_version"] == wine_regression.card["model_version"] and result["rows"] == 400
    scored = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(os.path.join(result["output_uri"], "*.csv")))])
    assert len(scored) == 400 and scored["predicted_quality"].between(0, 10).all()
    assert "quality" not in scored.columns
