"""The train stage's Ray-free parts: its spec, right-sizing, metrics and the model loader."""

from __future__ import annotations

import io
import json
import os
import time

import numpy as np
import pandas as pd
import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import ArtifactError, DataSourceError, SpecError
from airflow_ray_ml_stages.metrics import regression_metrics
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.models import load_model
from airflow_ray_ml_stages.specs import ComputeSpec, TrainSpec, XGBOOST_DEFAULTS, resolve_train_config
from airflow_ray_ml_stages.train.config import SKLEARN_FAMILIES
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig
from airflow_ray_ml_stages.train.run_dir import run_name
from airflow_ray_ml_stages.train.sizing import plan_training, plan_workers
from airflow_ray_ml_stages.train.stage import run_training
from tests.child import run_python
from tests.conftest import requires_ml_extra

DATA = {"artifact_dir": "/tmp/a", "train_uri": "/d/train.parquet", "validation_uri": "/d/validation.parquet",
        "test_uri": "/d/test.parquet", "feature_columns": ["x1", "x2", "x3"], "label_column": "y"}
GPU = {"use_gpu": True, "gpus_per_worker": 1, "num_workers": 2, "cpus_per_worker": 1.5, "accelerator": "gpu",
       "reason": "2 GPUs"}


def test_train_spec_defaults_round_trip_through_json():
    spec = TrainSpec(**DATA)
    assert TrainSpec.from_json(spec.to_json()) == spec
    assert spec.family == "lightning" and spec.resolved_config()["hidden_sizes"] == [64, 32]
    assert ComputeSpec.from_dict(spec.compute).use_gpu is False


def test_train_spec_tune_best_config_is_taken_as_is_with_defaults_filled():
    config = resolve_train_config({"family": "xgboost", "max_depth": 8, "eta": 0.05, "trial_id": "t1", "gamma": 0.1})
    assert config["max_depth"] == 8 and config["eta"] == 0.05 and config["gamma"] == 0.1
    assert config["num_boost_round"] == XGBOOST_DEFAULTS["num_boost_round"] and "trial_id" not in config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"config": {"family": "sklearn"}},
         "must be one of \\['lightning', 'xgboost', 'extra_trees', 'random_forest', 'linear'\\], got 'sklearn'"),
        ({"config": {"family": "extra_trees", "n_trees": 5}}, "unknown extra_trees hyperparameter\\(s\\) \\['n_trees'\\]"),
        ({"config": {"family": "random_forest", "max_features": 0}}, "max_features.*in \\(0, 1\\], got 0"),
        ({"config": {"family": "random_forest", "min_samples_leaf": 0.5}}, "min_samples_leaf.*integer >= 1, got 0.5"),
        ({"config": {"family": "lightning", "hidden_sizes": [64, 0]}}, "hidden_sizes.*got \\[64, 0\\]"),
        ({"config": {"family": "lightning", "hiden_sizes": [8]}}, "unknown lightning hyperparameter.*hiden_sizes"),
        ({"config": {"family": "lightning", "dropout": 1.5}}, "dropout.*got 1.5"),
        ({"config": {"family": "xgboost", "subsample": 0}}, "subsample.*got 0"),
        ({"feature_columns": []}, "feature_columns must be a non-empty list.*got \\[\\]"),
        ({"label_column": "x1"}, "label_column 'x1' is also listed"),
        ({"compute": {"use_gpu": "yes"}}, "ComputeSpec"),
        ({"num_workers": -1}, "num_workers must be an integer >= 0, got -1"),
        ({"gpu_placement_timeout_s": -2}, "gpu_placement_timeout_s.*got -2"),
        ({"data_loading": "stream"}, "data_loading must be one of.*got 'stream'"),
        ({"config": {"family": "xgboost", "scaler": "robust"}}, "config\\['scaler'\\] must be one of.*got 'robust'"),
        ({"config": {"family": "xgboost", "scaler": "minmax"}}, "asks for scaler 'minmax' but no preprocessor_uri"),
        ({"preprocessor_variants": {"minmax": ""}}, "preprocessor_variants must map scalers"),
    ],
)
def test_train_spec_bad_value_raises_quoting_it(fields, message):
    with pytest.raises(SpecError, match=message):
        TrainSpec(**{**DATA, **fields})


def test_plan_workers_small_data_trains_in_the_jobs_process_on_cpu_and_on_gpu():
    cpu = ComputeSpec.cpu("cpu", num_workers=4)
    assert plan_workers(TrainSpec(**DATA), cpu, 6_000, 2**20)[0] == 0
    assert plan_workers(TrainSpec(**DATA, compute=GPU), ComputeSpec.from_dict(GPU), 6_000, 2**20)[0] == 0


def test_plan_workers_large_data_uses_the_compute_specs_workers_unless_told():
    cpu = ComputeSpec.cpu("cpu", num_workers=3)
    workers, reason = plan_workers(TrainSpec(**DATA), cpu, 500_000, 100 * 2**20)
    assert workers == 3 and "500000 training rows >= scale_out_min_rows=200000" in reason
    assert plan_workers(TrainSpec(**DATA, num_workers=1), cpu, 500_000, 100 * 2**20)[0] == 1


def test_plan_workers_one_cpu_worker_on_large_data_trains_in_process_while_the_splits_fit():
    one = ComputeSpec.cpu("cpu", num_workers=1)
    workers, reason = plan_workers(TrainSpec(**DATA), one, 500_000, 100 * 2**20)
    assert workers == 0 and "plans one CPU worker and the splits (100 MiB in memory) fit" in reason
    assert plan_workers(TrainSpec(**DATA, direct_max_bytes=50 * 2**20), one, 500_000, 100 * 2**20)[0] == 1
    gpu_workers, gpu_reason = plan_workers(TrainSpec(**DATA, compute={**GPU, "num_workers": 1}), ComputeSpec.from_dict(
        {**GPU, "num_workers": 1}), 500_000, 100 * 2**20)
    assert gpu_workers == 0 and "plans one GPU worker" in gpu_reason  # the job's process is given the GPU


def test_plan_training_wine_table_on_gpu_node_trains_on_cpu_and_the_job_takes_no_gpu():
    spec = TrainSpec(**DATA, compute=GPU, config={"family": "xgboost"})
    plan = plan_training(spec, 4553, 1944)
    assert plan.device.use_gpu is False and plan.device.reason.startswith("4,553 rows: CPU is faster for XGBoost")
    assert plan.compute.use_gpu is False and plan.compute.reason == plan.device.reason
    assert (plan.compute.num_workers, plan.compute.cpus_per_worker) == (2, 1.5)  # the probe's sizing, on CPU
    assert plan.num_workers == 0 and plan.job_gpus == 0


def test_plan_training_gpu_work_for_one_worker_gives_the_job_the_gpu():
    spec = TrainSpec(**DATA, compute=GPU, config={"family": "xgboost"}, accelerator="gpu")
    plan = plan_training(spec, 4553, 1944)
    assert plan.device.use_gpu and plan.compute.use_gpu and plan.num_workers == 0 and plan.job_gpus == 1.0


def test_plan_training_large_gpu_work_on_several_gpus_uses_ray_train_workers():
    spec = TrainSpec(**DATA, compute=GPU, config={"family": "lightning"})
    plan = plan_training(spec, 5_000_000, 1_000_000)
    assert plan.device.use_gpu and plan.num_workers == 2 and plan.job_gpus == 0  # the workers hold the GPUs
    assert plan_training(TrainSpec(**DATA, compute=GPU, config={"family": "lightning"}, accelerator="gpu",
                                   num_workers=1), 4553, 1944).job_gpus == 0  # num_workers=1 asks for a Ray Train worker (restarts)


def test_plan_training_cpu_probe_never_takes_a_gpu():
    plan = plan_training(TrainSpec(**DATA, accelerator="gpu"), 5_000_000, 1_000_000)
    assert plan.device.use_gpu is False and plan.job_gpus == 0 and "probe found no usable GPU" in plan.device.reason


@pytest.mark.integration
def test_job_holds_gpu_only_when_submitted_with_entrypoint_num_gpus(fake_gpu_cluster):
    """What the train stage reads to train on the job's own GPU, as a real Ray job sees it."""
    from ray.job_submission import JobSubmissionClient

    code = "from airflow_ray_ml_stages.train.sizing import job_holds_gpu; print('holds a GPU:', job_holds_gpu())"
    client = JobSubmissionClient(fake_gpu_cluster.dashboard_url,
                                 headers={"Authorization": f"Bearer {fake_gpu_cluster.token}"})
    jobs = {resources: client.submit_job(entrypoint=f'python -c "{code}"', **dict(resources))
            for resources in ((("entrypoint_num_gpus", 1),), (), (("entrypoint_num_cpus", 0.5),))}
    seen = {}
    for resources, job in jobs.items():
        deadline = time.monotonic() + 120
        while str(client.get_job_status(job)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, client.get_job_logs(job)
            time.sleep(0.2)
        # The job's log file can lag its status: read until the job's own line is in it.
        while not (lines := [line for line in client.get_job_logs(job).splitlines() if line.startswith("holds a GPU:")]):
            assert time.monotonic() < deadline, client.get_job_logs(job)
            time.sleep(0.2)
        seen[resources] = lines[-1]
    assert list(seen.values()) == ["holds a GPU: True", "holds a GPU: False", "holds a GPU: False"], seen


@pytest.mark.parametrize("config", [{"family": "xgboost", "num_boost_round": 20, "early_stopping_rounds": 0},
                                    {"family": "lightning", "max_epochs": 3, "patience": 0, "hidden_sizes": [16]}])
@requires_ml_extra
def test_local_mode_runs_in_process_without_ray(tmp_path, config):
    """A wine-scale CPU run needs no Ray cluster: it neither connects to nor imports Ray."""
    from tests.conftest import ROOT
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=1500, seed=3)
    # Over scale_out_min_rows with the default compute (one CPU worker): still in-process.
    spec = {**fields, "artifact_dir": str(tmp_path / "train"), "config": config, "scale_out_min_rows": 500}
    code = ("import json, sys; from airflow_ray_ml_stages.specs import TrainSpec; from airflow_ray_ml_stages.train.stage import run_training; "
            "result = run_training(TrainSpec.from_json(sys.argv[1])); "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'imported ray'; "
            "report(result.to_dict())")
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "include")])
    result = run_python(code, json.dumps(spec), env=env, timeout=120).result
    done_iterations = result["training"].get("rounds_run", result["training"].get("epochs_run"))
    assert result["training"]["runner"] == "in_process" and done_iterations == (20 if config["family"] == "xgboost" else 3)
    assert result["compute_used"]["local_mode"] is True and result["compute_used"]["num_workers"] == 0
    assert "plans one CPU worker" in result["compute_used"]["sizing_reason"]
    assert result["compute_used"]["device_reason"].startswith("CPU: the probe found no usable GPU")
    card = ModelCard.read(str(tmp_path / "train" / "model"))
    assert card.framework_versions["ray"] and card.metrics == result["metrics"]
    assert card.model_version == result["model_version"] and card.training["runner"] == "in_process"
    assert result["metrics"]["test"]["rmse"] < result["baseline"]["test_rmse"]
    model = load_model(str(tmp_path / "train" / "model"))
    with np.load(tmp_path / "train" / "evaluation" / "test.npz", allow_pickle=False) as saved:
        predictions = saved["y_pred"]
    test = pd.read_parquet(fields["test_uri"])
    np.testing.assert_allclose(model.predict(test[fields["feature_columns"]].to_numpy(np.float32)), predictions,
                               rtol=1e-5, atol=1e-5)


def test_run_name_differs_per_task_run_and_repeats_for_its_retries():
    assert run_name("/r/dag/run1/train") == run_name("/r/dag/run1/train")
    assert run_name("/r/dag/run1/train") != run_name("/r/dag/run2/train")


def test_regression_metrics_count_tolerances_inclusively():
    metrics = regression_metrics([5, 6, 7, 8], [5.5, 6, 8, 6])
    assert metrics["acc_0_5"] == 0.5 and metrics["acc_1_0"] == 0.75
    assert metrics["mae"] == pytest.approx(0.875) and metrics["rmse"] == pytest.approx(np.sqrt(5.25 / 4))


def _card(family: str) -> dict:
    return {"family": family, "feature_columns": ["x1", "x2", "x3"], "label_column": "quality", "config": {},
            "metrics": {"validation": {"rmse": 0.5}}, "seed": 0, "data_fingerprint": None, "preprocessor": None}


def test_model_card_round_trips_and_drops_only_unset_optional_fields(tmp_path):
    card = ModelCard.from_dict(_card("xgboost"))
    card.write(str(tmp_path))
    written = json.loads((tmp_path / "model_card.json").read_text())
    assert written == {**_card("xgboost"), "task": "regression"}  # preprocessor: null stays; unset ones are left out
    assert ModelCard.read(str(tmp_path)) == card
    newer = {**_card("xgboost"), "model_version": "xgboost-1", "written_by": "a later version"}
    assert ModelCard.from_dict(newer).model_version == "xgboost-1"  # fields it does not know are ignored


def test_model_card_without_a_needed_field_names_it(tmp_path):
    card = {key: value for key, value in _card("lightning").items() if key != "label_column"}
    artifacts.write_json_atomic(str(tmp_path / "model_card.json"), card)
    with pytest.raises(ArtifactError, match=r"lacks field\(s\) \['label_column'\]"):
        load_model(str(tmp_path))
    with pytest.raises(ArtifactError, match="is not a model directory"):
        ModelCard.read(str(tmp_path / "elsewhere"))


def test_train_loop_config_crosses_ray_train_as_a_dict_and_rejects_wrong_keys():
    config = TrainLoopConfig(config=resolve_train_config({"family": "xgboost", "num_boost_round": 50}),
                             feature_columns=["x1"], label_column="y", label_mean=1.5, label_std=2.0, seed=0, use_gpu=False,
                             local_mode=True, threads=1, checkpoint_every=None, artifact_dir="/a", model_dir="/a/m",
                             uris={"train": "/d/t.parquet"}, data_loading="direct")
    assert TrainLoopConfig.of(json.loads(json.dumps(config.to_dict()))) == config
    assert config.checkpoint_interval() == 5  # a tenth of the rounds when checkpoint_every is unset
    with pytest.raises(TypeError, match=r"missing \['seed'\], unknown \['sead'\]"):
        TrainLoopConfig.of({**{k: v for k, v in config.to_dict().items() if k != "seed"}, "sead": 0})


@requires_ml_extra
def test_load_model_lightning_state_dict_predicts_like_the_module(tmp_path):
    import torch

    from airflow_ray_ml_stages.models.mlp import MLP, model_config

    torch.manual_seed(0)
    module = MLP(3, [8, 4], dropout=0.2, label_offset=5.5, label_scale=40.0).eval()
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    (tmp_path / "model.pt").write_bytes(buffer.getvalue())
    config = model_config(3, [8, 4], 0.2, 5.5, 40.0)
    (tmp_path / "model_config.json").write_text(json.dumps(config))
    (tmp_path / "model_card.json").write_text(json.dumps(_card("lightning")))
    features = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    model = load_model(str(tmp_path))
    with torch.inference_mode():
        expected = module(torch.from_numpy(features)).numpy()
        unscaled = module.net(torch.from_numpy(features)).squeeze(-1).numpy() + 5.5
    np.testing.assert_allclose(model.predict(features), expected, rtol=1e-6)
    assert model.card.family == "lightning" and model.predict(features[0]).shape == (1,)
    # A model directory written before label_scale existed: its config lacks it, the scale is 1.
    (tmp_path / "model_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "label_scale"}))
    np.testing.assert_allclose(load_model(str(tmp_path)).predict(features), unscaled, rtol=1e-6)


@requires_ml_extra
def test_load_model_xgboost_ubj_predicts_like_the_booster(tmp_path):
    import xgboost

    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(200, 3)).astype(np.float32), rng.normal(size=200)
    booster = xgboost.train({"max_depth": 2}, xgboost.DMatrix(features, label=labels, feature_names=["x1", "x2", "x3"]), 5)
    (tmp_path / "model.ubj").write_bytes(bytes(booster.save_raw("ubj")))
    (tmp_path / "model_card.json").write_text(json.dumps(_card("xgboost")))
    model = load_model(str(tmp_path))
    expected = booster.predict(xgboost.DMatrix(features, feature_names=["x1", "x2", "x3"]))
    np.testing.assert_allclose(model.predict(features), expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"expected features of shape \(rows, 3\), got \(200, 2\)"):
        model.predict(features[:, :2])


def test_load_model_unknown_family_raises(tmp_path):
    artifacts.write_json_atomic(str(tmp_path / "model_card.json"), _card("sklearn"))
    with pytest.raises(ArtifactError, match="unknown family 'sklearn'"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("family, label_threshold", [("xgboost", None), ("lightning", None), ("xgboost", 7),
                                                     ("lightning", 7)])
@requires_ml_extra
def test_classification_trains_both_families_and_predicts_class_probabilities(tmp_path, family, label_threshold):
    """Multiclass (the grades) and binary (grade >= 7): the models beat the class-shares baseline."""
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=2000, seed=5, classification=True, label_threshold=label_threshold)
    config = ({"family": "xgboost", "num_boost_round": 60, "early_stopping_rounds": 10} if family == "xgboost" else
              {"family": "lightning", "max_epochs": 15, "patience": 0, "hidden_sizes": [32]})
    result = run_training(TrainSpec(**fields, artifact_dir=str(tmp_path / "train"), config=config))
    classes = fields["classes"]
    assert result.task == "classification" and result.classes == classes
    test, baseline = result.metrics["test"], result.baseline
    assert set(test) == {"log_loss", "accuracy", "macro_f1"}
    assert test["log_loss"] < baseline["test_log_loss"] and test["accuracy"] > baseline["test_accuracy"]
    assert sum(baseline["train_class_shares"]) == pytest.approx(1)
    card = ModelCard.read(result.model_dir)
    assert card.task == "classification" and card.classes == classes
    model = load_model(result.model_dir)
    test_rows = pd.read_parquet(fields["test_uri"])
    probabilities = model.predict(test_rows[fields["feature_columns"]].to_numpy(np.float32))
    assert probabilities.shape == (len(test_rows), len(classes))
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    with np.load(tmp_path / "train" / "evaluation" / "test.npz", allow_pickle=False) as saved:
        np.testing.assert_allclose(probabilities, saved["y_pred"], rtol=1e-4, atol=1e-5)
    accuracy = float(np.mean(probabilities.argmax(axis=1) == test_rows["quality"].to_numpy()))
    assert accuracy == pytest.approx(test["accuracy"])


XGBOOST_FOREST = {"family": "xgboost", "num_parallel_tree": 100, "num_boost_round": 1, "eta": 1.0, "max_depth": 12,
                  "subsample": 0.632, "colsample_bytree": 1.0, "colsample_bynode": 0.8, "min_child_weight": 1.0,
                  "reg_lambda": 1e-6}


@requires_ml_extra
def test_xgboost_forest_trains_on_columns_xgboost_refuses_by_name(tmp_path):
    """XGBoost grown as a random forest (booster parameters beyond the checked ones) trains and loads; one-hot
    columns of categories such as ``1. <=Good`` or ``[a]`` are names XGBoost's DMatrix refuses, and still train
    and serve."""
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=1500, seed=3)
    renamed = {"type_red": "type=1. <=Red", "type_white": "type=[white]"}
    for split in ("train", "validation", "test"):
        path = fields[f"{split}_uri"]
        pd.read_parquet(path).rename(columns=renamed).to_parquet(path)
    fields["feature_columns"] = [renamed.get(column, column) for column in fields["feature_columns"]]
    forest = XGBOOST_FOREST
    result = run_training(TrainSpec(**{**fields, "preprocessor_uri": None}, artifact_dir=str(tmp_path / "train"),
                                    config=forest))
    assert result.training["rounds_kept"] == 1 and result.metrics["test"]["rmse"] < result.baseline["test_rmse"]
    model = load_model(result.model_dir)
    test = pd.read_parquet(fields["test_uri"])
    with np.load(tmp_path / "train" / "evaluation" / "test.npz", allow_pickle=False) as saved:
        np.testing.assert_allclose(model.predict(test[fields["feature_columns"]].to_numpy(np.float32)),
                                   saved["y_pred"], rtol=1e-5, atol=1e-5)
    assert len(model.booster.get_dump()) == forest["num_parallel_tree"]


def test_classification_split_with_a_label_outside_the_classes_is_refused(tmp_path):
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=600, seed=5, classification=True)  # indexes of 3..9
    with pytest.raises(DataSourceError, match=r"class indexes 0\.\.2 .*\[3, 4, 5\]"):
        run_training(TrainSpec(**{**fields, "classes": [3, 4, 5]}, artifact_dir=str(tmp_path / "t"),
                               config={"family": "xgboost", "num_boost_round": 2}))


@requires_ml_extra
def test_lightning_regression_label_in_other_units_trains_to_the_same_relative_error(tmp_path):
    """The MLP learns the standardised label: a label times 1000 takes the same path, 1000 times larger."""
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=1500, seed=3)
    label = fields["label_column"]
    config = {"family": "lightning", "max_epochs": 4, "patience": 0, "hidden_sizes": [16]}
    rmse = {}
    for factor in (1, 1000):
        uris = {}
        for split in ("train", "validation", "test"):
            frame = pd.read_parquet(fields[f"{split}_uri"])
            frame[label] = frame[label] * factor
            uris[f"{split}_uri"] = str(tmp_path / f"{split}-x{factor}.parquet")
            frame.to_parquet(uris[f"{split}_uri"], index=False)
        result = run_training(TrainSpec(**{**fields, **uris}, artifact_dir=str(tmp_path / f"train-x{factor}"),
                                        config=config))
        assert result.metrics["test"]["rmse"] < result.baseline["test_rmse"]
        assert json.loads((tmp_path / f"train-x{factor}" / "model" / "model_config.json").read_text())[
            "label_scale"] == pytest.approx(pd.read_parquet(uris["train_uri"])[label].std(ddof=0), rel=1e-6)
        rmse[factor] = result.metrics["test"]["rmse"] / factor
    assert rmse[1000] == pytest.approx(rmse[1], rel=1e-2)


SKLEARN_CONFIGS = {"extra_trees": ({"n_estimators": 40, "min_samples_leaf": 2}, "forest.npz"),
                   "random_forest": ({"n_estimators": 40, "min_samples_leaf": 2}, "forest.npz"),
                   "linear": ({"alpha": 0.5}, "linear.npz")}


@pytest.mark.parametrize("family", SKLEARN_FAMILIES)
@pytest.mark.parametrize("classification", [False, True])
@requires_ml_extra
def test_scikit_learn_family_trains_in_process_saves_plain_arrays_and_serves_without_it(tmp_path, family,
                                                                                       classification):
    """A forest or the linear model trains in the job's process, beats the baseline, and its model file holds
    numbers only; a process that cannot import scikit-learn loads it and predicts what training scored."""
    from tests.hidden_packages import hiding_env
    from tests.conftest import ROOT
    from tests.train_data import write_splits

    fields = write_splits(tmp_path / "splits", rows=1500, seed=3, classification=classification)
    config, model_file = SKLEARN_CONFIGS[family]
    result = run_training(TrainSpec(**fields, artifact_dir=str(tmp_path / "train"), config={"family": family, **config},
                                    num_workers=2))  # it trains in one process whatever the spec asks
    assert result.training["runner"] == "in_process" and result.training.get("trees", 40) == 40
    assert result.compute_used["num_workers"] == 0 and "trains in one process" in result.compute_used["sizing_reason"]
    if classification:  # a forest's leaves give rare grades probability 0: its log loss is not the point here
        assert result.metrics["test"]["accuracy"] > result.baseline["test_accuracy"]
    else:
        assert result.metrics["test"]["rmse"] < result.baseline["test_rmse"]
    assert ModelCard.read(result.model_dir).framework_versions["scikit-learn"]
    with np.load(os.path.join(result.model_dir, model_file), allow_pickle=False) as arrays:
        assert all(arrays[name].dtype.kind in "if" for name in arrays.files)
    env = hiding_env(["sklearn"], tmp_path / "hide")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT), str(ROOT / "include")])
    code = ("import sys, json, numpy as np, pandas as pd; from airflow_ray_ml_stages.models import load_model; "
            "model = load_model(sys.argv[1]); test = pd.read_parquet(sys.argv[2]); "
            "report(model.predict(test[json.loads(sys.argv[3])].to_numpy(np.float32)).tolist()); "
            "assert 'sklearn' not in sys.modules")
    served = np.asarray(run_python(code, result.model_dir, fields["test_uri"], json.dumps(fields["feature_columns"]),
                                   env=env, timeout=120).result)
    with np.load(tmp_path / "train" / "evaluation" / "test.npz", allow_pickle=False) as saved:
        np.testing.assert_allclose(served, saved["y_pred"], rtol=1e-12, atol=1e-12)


@requires_ml_extra
def test_linear_arrays_predict_what_scikit_learn_predicts_with_a_class_absent_from_training():
    from sklearn.linear_model import LogisticRegression, Ridge

    from airflow_ray_ml_stages.models.linear import linear_bytes, linear_predict

    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 5))
    ridge = Ridge(alpha=2.0).fit(x, x @ np.arange(5.0) + 1)
    np.testing.assert_allclose(linear_predict(linear_bytes(ridge, None), x), ridge.predict(x), rtol=1e-10, atol=1e-10)
    binary = LogisticRegression().fit(x, (x[:, 0] > 0).astype(int))
    np.testing.assert_allclose(linear_predict(linear_bytes(binary, 2), x), binary.predict_proba(x), rtol=1e-9,
                               atol=1e-12)
    labels = np.digitize(x[:, 0], [-0.5, 0.5]) * 2  # classes 0, 2 and 4 of 5
    multi = LogisticRegression(C=0.5).fit(x, labels)
    probabilities = linear_predict(linear_bytes(multi, 5), x)
    np.testing.assert_allclose(probabilities[:, [0, 2, 4]], multi.predict_proba(x), rtol=1e-9, atol=1e-12)
    assert not probabilities[:, [1, 3]].any()
    two_of_three = LogisticRegression().fit(x, (x[:, 1] > 0).astype(int) * 2)  # classes 0 and 2 of 3
    found = linear_predict(linear_bytes(two_of_three, 3), x)
    np.testing.assert_allclose(found[:, [0, 2]], two_of_three.predict_proba(x), rtol=1e-9, atol=1e-12)


@requires_ml_extra
def test_forest_arrays_predict_what_scikit_learn_predicts_and_refuse_a_damaged_file():
    """The arrays give scikit-learn's own predictions (a class absent from training has probability 0), and a
    file whose nodes point outside it is refused rather than read out of bounds."""
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestClassifier

    from airflow_ray_ml_stages.models.forest import ForestTrees, forest_arrays, forest_bytes

    rng = np.random.default_rng(0)
    x = rng.normal(size=(900, 6)).astype(np.float32)
    y = x[:, 0] * 2 + np.sin(3 * x[:, 1]) + rng.normal(scale=0.2, size=900)
    regressor = ExtraTreesRegressor(n_estimators=25, min_samples_leaf=2, random_state=0).fit(x[:600], y[:600])
    np.testing.assert_allclose(ForestTrees(forest_bytes(regressor, None)).predict(x[600:])[:, 0],
                               regressor.predict(x[600:]), rtol=1e-12, atol=1e-12)
    labels = (x[:, 0] > 0).astype(int) * 2  # classes 0 and 2 of 3: class 1 never trained
    classifier = RandomForestClassifier(n_estimators=25, random_state=0).fit(x[:600], labels[:600])
    probabilities = ForestTrees(forest_bytes(classifier, 3)).predict(x[600:])
    np.testing.assert_allclose(probabilities[:, [0, 2]], classifier.predict_proba(x[600:]), rtol=1e-12, atol=1e-12)
    assert not probabilities[:, 1].any()
    arrays = forest_arrays(regressor, None)
    arrays["left"][arrays["left"] >= 0] += len(arrays["left"])
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with pytest.raises(ValueError, match="a node points outside the file"):
        ForestTrees(buffer.getvalue())
