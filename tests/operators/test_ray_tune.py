"""RayTuneOperator end to end: dag.test() runs the tune stage (and RayTrain on its best config) on a real cluster."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from airflow_ray_ml.errors import RayOperatorError
from airflow_ray_ml.ray_tune import RayTuneOperator
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.models import load_model
from airflow_ray_ml_stages.preprocessor import apply_affine
from airflow_ray_ml_stages.train.run_dir import read_evaluation
from airflow_ray_ml_stages.train.config import FAMILY_DEFAULTS
from tests.conftest import load_dag
from tests.dag_fixtures.tune_dags import START_CONFIGS
from tests.operators.test_ray_job import _xcom
from airflow_ray_ml_stages.metrics import regression_metrics
from tests.train_data import load_split, write_preprocessed

LOGICAL_DATE = datetime(2026, 5, 1, tzinfo=timezone.utc)
# Every family, both scalers, tiny budgets: 2 epochs / 20 rounds / 20 trees.
SMALL_SPACE = {
    "family": {"choice": ["lightning", "xgboost", "extra_trees", "random_forest"]},
    "scaler": {"choice": ["standard", "minmax"]},
    "lightning": {"hidden_sizes": {"choice": [[16], [32, 16]]}, "lr": {"loguniform": [1e-3, 1e-2]}, "max_epochs": 2},
    "xgboost": {"max_depth": {"randint": [2, 6]}, "eta": {"uniform": [0.1, 0.3]}, "num_boost_round": 20},
    "extra_trees": {"min_samples_leaf": {"randint": [1, 4]}, "n_estimators": 20},
    "random_forest": {"max_features": {"uniform": [0.3, 0.9]}, "n_estimators": 20},
}


@pytest.fixture(scope="module")
def preprocess(tmp_path_factory) -> dict:
    """A preprocess manifest's fields for 3,000 generated wine rows, written with the standard scaler."""
    return write_preprocessed(tmp_path_factory.mktemp("tune-data"), rows=3000, seed=11)


def preprocess_scaler(preprocess: dict) -> str:
    """The scaler the splits were written with."""
    return json.loads(Path(preprocess["preprocessor_uri"]).read_text())["scaler"]


def _run(dag_id: str, preprocess: dict, space: dict, day: int = 0):
    when = LOGICAL_DATE.replace(day=1 + day)
    return load_dag(dag_id).test(logical_date=when, run_after=when,
                                 run_conf={"preprocess": preprocess, "search_space": space})


@pytest.mark.integration
def test_tune_small_search_ranks_every_trial_and_train_reproduces_the_best(airflow_db, ray_conn, preprocess):
    dag_run = _run("tune_then_train", preprocess, SMALL_SPACE)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    assert manifest["metric"] == "val_rmse" and manifest["mode"] == "min"
    assert manifest["searcher"] == "adaptive" and manifest["scheduler"] == "asha"
    trials = manifest["trials"]
    assert trials["total"] == 4 and trials["failed"] == 0 and trials["completed"] >= 1
    assert trials["completed"] + trials["early_stopped"] == 4
    # the DAG's max_concurrent_trials=2 holds, though the trials' CPUs would fit all four at once
    assert 1 <= manifest["most_trials_at_once"] <= 2

    everything = json.loads(Path(manifest["leaderboard_json_uri"]).read_text())
    assert [row["rank"] for row in everything] == [1, 2, 3, 4, 5]
    # Averaging the forests' and XGBoost's trials beats each of them on validation: the ensemble is the best.
    ensemble, *rows = everything
    assert ensemble["trial_id"] == manifest["best_trial_id"] == "ensemble" and ensemble["family"] == "ensemble"
    members = ensemble["config"]["members"]
    assert manifest["best_config"] == ensemble["config"] and len(members) >= 2
    assert sum(member["weight"] for member in members) == pytest.approx(1)
    by_id = {row["trial_id"]: row for row in rows}
    for member in members:
        trial = by_id[member["trial_id"]]
        assert trial["status"] == "COMPLETED" and member["family"] == trial["family"]
        assert member["validation"]["rmse"] == trial["metrics"]["val_rmse"] > ensemble["metrics"]["val_rmse"]
    assert len({row["trial_id"] for row in rows}) == 4
    # The start configs ran as given (the forests with keys the space does not name): one trial per family.
    assert sorted(row["family"] for row in rows) == sorted(SMALL_SPACE["family"]["choice"])
    for start in START_CONFIGS:
        assert [row for row in rows if start.items() <= row["config"].items()], start
    completed = [row["metrics"]["val_rmse"] for row in everything if row["status"] == "COMPLETED"]
    assert completed == sorted(completed) and rows[0]["status"] == "COMPLETED"
    assert ensemble["metrics"]["val_rmse"] == manifest["best_metric"] == manifest["best_metrics"]["val_rmse"]
    for row in rows:
        assert row["iterations"] >= 1 and row["time_s"] > 0 and row["error"] is None
        assert set(row["metrics"]) == {"val_rmse", "val_mae", "val_acc_0_5", "val_acc_1_0"}
        own = set(FAMILY_DEFAULTS[row["family"]])
        assert set(SMALL_SPACE[row["family"]]) <= set(row["config"])
        assert not {key for family in FAMILY_DEFAULTS for key in FAMILY_DEFAULTS[family]} - own & set(row["config"])

    with open(manifest["leaderboard_csv_uri"], newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [row["trial_id"] for row in table] == [row["trial_id"] for row in everything]
    assert float(table[0]["val_rmse"]) == manifest["best_metric"]
    assert Path(manifest["plot_uri"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Each trial's history (the plot's curves) is kept by Tune's CSV and JSON loggers; no TensorBoard
    # files, whose logger costs a second of imports (constants.JOB_ENV_VARS)
    written = {path.name for path in (Path(manifest["artifact_dir"]) / "tune_runs").rglob("*") if path.is_file()}
    assert {"progress.csv", "result.json"} <= written
    assert not [name for name in written if name.startswith("events.out.tfevents")]

    # The best checkpoint is the ensemble's model directory: it predicts the metric the leaderboard shows, each
    # member given the features as its own scaler scales them (the random forest's minmax, the others' standard).
    model = load_model(manifest["best_checkpoint_uri"])
    assert model.family == "ensemble" and [weight for weight, _, _ in model.members] == [m["weight"] for m in members]
    x, y = load_split(preprocess["split_uris"]["validation"], preprocess["feature_columns"], preprocess["label_column"])
    assert regression_metrics(y, model.predict(x))["rmse"] == pytest.approx(manifest["best_metric"], rel=1e-9)
    assert not list(Path(manifest["artifact_dir"]).rglob("test.npz"))  # the test split was never scored
    assert not (Path(manifest["artifact_dir"]) / "folds").exists()  # 450 validation rows rank the trials

    # RayTrain given the ensemble assembles it from the trials' models, as trained: the same validation metric.
    trained = _xcom(dag_run, "train")
    assert trained["family"] == "ensemble" and trained["training"]["runner"] == "assemble"
    assert trained["metrics"]["validation"]["rmse"] == pytest.approx(manifest["best_metric"], rel=1e-9)
    assert trained["metrics"]["test"]["rmse"] < trained["baseline"]["test_rmse"]
    card = json.loads((Path(trained["model_dir"]) / "model_card.json").read_text())
    assert [(m["dir"], m["trial_id"], m["weight"]) for m in card["config"]["members"]] == [
        (f"members/{index}", m["trial_id"], m["weight"]) for index, m in enumerate(members)]
    for index, member in enumerate(members):
        copied = Path(trained["model_dir"]) / "members" / str(index)
        assert json.loads((copied / "model_card.json").read_text())["trial_id"] == member["trial_id"]
    served_scaler = json.loads((Path(trained["model_dir"]) / "preprocessor.json").read_text())["scaler"]
    assert served_scaler == preprocess_scaler(preprocess)


@pytest.mark.integration
def test_a_small_table_is_cross_validated_and_each_trial_served_as_its_bagged_fold_models(
        airflow_db, ray_conn, tmp_path_factory):
    """1,000 rows: a validation split of 150 rows is too few to rank by, so the 850 training and validation rows
    are pooled into 5 folds (TuneSpec.cv_folds); every trial is ranked on its out-of-fold predictions of all
    of them, and what RayTrain serves is fold models."""
    data = write_preprocessed(tmp_path_factory.mktemp("cv-data"), rows=1000, seed=12)
    features, label = data["feature_columns"], data["label_column"]
    pooled = [load_split(data["split_uris"][split], features, label)
              for split in ("train", "validation")]
    pooled_x, pooled_y = np.concatenate([x for x, _ in pooled]), np.concatenate([y for _, y in pooled])
    dag_run = _run("tune_then_train", data, SMALL_SPACE, day=8)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    directory = Path(manifest["artifact_dir"])

    # Each fold validates on rows the fold does not train on; the folds' validation rows are the pooled rows.
    held_out = []
    for fold in range(5):
        train_x, _ = load_split(str(directory / "folds" / str(fold) / "train.parquet"), features, label)
        val_x, _ = load_split(str(directory / "folds" / str(fold) / "validation.parquet"), features, label)
        assert not {tuple(row) for row in train_x} & {tuple(row) for row in val_x}
        assert len(train_x) + len(val_x) == len(pooled_x) and 165 <= len(val_x) <= 175
        held_out.append(val_x)
    assert sorted(map(tuple, np.concatenate(held_out))) == sorted(map(tuple, pooled_x))

    rows = [row for row in json.loads(Path(manifest["leaderboard_json_uri"]).read_text())
            if row["status"] == "COMPLETED" and row["trial_id"] != "ensemble"]
    assert rows
    for row in rows:
        labels, predicted = read_evaluation(str(directory / "trials" / row["trial_id"]), "validation")
        assert np.array_equal(np.sort(labels), np.sort(pooled_y))  # out of fold: every pooled row once
        assert regression_metrics(labels, predicted)["rmse"] == pytest.approx(row["metrics"]["val_rmse"])
        model = load_model(str(directory / "trials" / row["trial_id"] / "model"))
        assert model.family == "ensemble" and [weight for weight, _, _ in model.members] == [0.2] * 5
        # the fold-0 model, given the rows it was validated on, predicts what the out-of-fold file holds
        assert np.allclose(model.members[0][1].predict(held_out[0] if model.members[0][2] is None
                                                        else apply_affine(held_out[0], *model.members[0][2])),
                           predicted[:len(held_out[0])], rtol=1e-5, atol=1e-5)

    best = manifest["best_config"]
    assert best["family"] == "ensemble" and sorted({m["fold"] for m in best["members"]}) == [0, 1, 2, 3, 4]
    assert sum(member["weight"] for member in best["members"]) == pytest.approx(1)
    trained = _xcom(dag_run, "train")
    assert trained["family"] == "ensemble" and trained["training"]["runner"] == "assemble"
    assert trained["training"]["members"] == len(best["members"])
    assert trained["metrics"]["test"]["rmse"] < trained["baseline"]["test_rmse"]


@pytest.mark.integration
def test_tune_all_trials_failing_ends_the_task_with_the_reason(failed_tune_run, artifact_root):
    dag_run = failed_tune_run  # every trial fails inside XGBoost (conftest.FAILING_SPACE)
    directory = artifacts.run_dir(artifact_root, "tune_only", dag_run.run_id, "tune")
    manifest = json.loads((Path(directory) / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "no trial completed: 4 trial(s), 4 failed" in manifest["error"]
    assert "no_such_method" in manifest["error"]  # the trials' own error, not a generic one
    rows = json.loads((Path(directory) / "leaderboard.json").read_text())
    assert len(rows) == 4 and {row["status"] for row in rows} == {"FAILED"}
    assert all("no_such_method" in row["error"] for row in rows)


@pytest.mark.integration
def test_tune_optuna_searcher_samples_inside_the_space_and_every_trial_completes(airflow_db, ray_conn, preprocess):
    space = {"family": "xgboost", "scaler": {"choice": ["standard", "none"]},
             "xgboost": {"max_depth": {"randint": [2, 6]}, "eta": {"loguniform": [0.05, 0.3]}, "num_boost_round": 15}}
    dag_run = _run("tune_optuna", preprocess, space, day=2)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    assert manifest["searcher"] == "optuna" and manifest["scheduler"] == "none"
    assert manifest["trials"] == {"total": 4, "completed": 4, "failed": 0, "early_stopped": 0}
    rows = [row for row in json.loads(Path(manifest["leaderboard_json_uri"]).read_text()) if row["trial_id"] != "ensemble"]
    for row in rows:
        assert 2 <= row["config"]["max_depth"] < 6 and 0.05 <= row["config"]["eta"] <= 0.3
        assert row["scaler"] in ("standard", "none") and row["iterations"] >= 2
    assert len({row["config"]["eta"] for row in rows}) == 4  # the searcher proposed four configs
    assert manifest["best_metric"] <= min(r["metrics"]["val_rmse"] for r in rows)


@pytest.mark.integration
@pytest.mark.parametrize("forest", ["extra_trees", "random_forest"])
def test_a_forest_family_is_chosen_by_the_search_on_a_table_where_it_is_best(airflow_db, ray_conn, preprocess, forest):
    """Against a Lightning net of one epoch and one-round XGBoost stumps, on the generated wine table, the forest's
    trials are the search's best: it is searched, trained in a trial, scored and ranked like the others."""
    space = {"family": {"choice": ["lightning", "xgboost", forest]}, "scaler": "standard",
             "lightning": {"max_epochs": 1, "hidden_sizes": [4]},
             "xgboost": {"num_boost_round": 1, "max_depth": 1},
             forest: {"n_estimators": 40, "min_samples_leaf": {"randint": [1, 4]}}}
    dag_run = _run("tune_only", preprocess, space, day=4 + ["extra_trees", "random_forest"].index(forest))
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    rows = [row for row in json.loads(Path(manifest["leaderboard_json_uri"]).read_text())
            if row["trial_id"] != "ensemble"]
    assert {row["family"] for row in rows} >= {forest} and rows[0]["status"] == "COMPLETED"
    assert rows[0]["family"] == forest  # the best trial
    best = manifest["best_config"]
    assert best["family"] == forest or {m["family"] for m in best["members"]} >= {forest}


def _operator(**kwargs) -> RayTuneOperator:
    from airflow.sdk import DAG

    with DAG(dag_id="tune_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        return RayTuneOperator(task_id="tune", **kwargs)


class _TI:
    dag_id = "tune_unit"
    map_index = -1

    def __init__(self, xcom=None):
        self._xcom = xcom

    def xcom_pull(self, task_ids):
        return self._xcom


MANIFEST = {"split_uris": {"train": "/d/train", "validation": "/d/validation", "test": "/d/test"},
            "feature_columns": ["a", "b"], "label_column": "quality", "preprocessor_uri": "/d/p.json",
            "preprocessor_variants": {"standard": "/d/s.json", "minmax": "/d/m.json"}, "fingerprint": "f1"}


def test_tune_operator_builds_its_spec_from_the_preprocess_xcom_and_compute(tmp_path):
    compute = {"use_gpu": False, "gpus_per_worker": 0, "num_workers": 1, "cpus_per_worker": 1.0,
               "accelerator": "cpu", "reason": "probe"}
    operator = _operator(artifact_root=str(tmp_path), compute=compute, searcher="optuna", num_samples="8",
                         data=MANIFEST)
    spec = operator.full_spec({"ti": _TI(), "run_id": "r1"})
    assert spec["train_uri"] == "/d/train" and spec["validation_uri"] == "/d/validation"
    assert "test_uri" not in spec  # choosing never sees the test split
    assert spec["preprocessor_variants"] == MANIFEST["preprocessor_variants"] and spec["data_fingerprint"] == "f1"
    assert spec["compute"] == compute and spec["num_samples"] == 8 and spec["searcher"] == "optuna"
    assert spec["search_space"] is None  # the default space


def test_tune_operator_bad_space_fails_before_any_job(tmp_path):
    operator = _operator(artifact_root=str(tmp_path), search_space={"family": "xgboost", "xgboost": {"eta": {"uniform": [0, 3]}}},
                         data=MANIFEST)
    with pytest.raises(RayOperatorError, match=r"invalid tune spec.*\['eta'\] allows 0, which training rejects"):
        operator.full_spec({"ti": _TI(), "run_id": "r1"})


def test_tune_operator_without_a_validation_split_says_what_to_change(tmp_path):
    operator = _operator(artifact_root=str(tmp_path), data={**MANIFEST, "split_uris": {"train": "/d/t"}})
    with pytest.raises(RayOperatorError, match="lacks \\['validation_uri'\\].*with train and validation splits"):
        operator.full_spec({"ti": _TI(), "run_id": "r1"})


def test_tune_operator_template_fields_name_its_arguments():
    operator = _operator(data=MANIFEST)
    for name in RayTuneOperator.template_fields:
        assert hasattr(operator, name), name
