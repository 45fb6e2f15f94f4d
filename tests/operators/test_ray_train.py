"""RayTrainOperator end to end: dag.test() runs the train stage as a Ray job on a real local cluster."""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
from datetime import datetime, timedelta, timezone
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from airflow_ray_ml.errors import RayOperatorError
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.models import load_model
from airflow_ray_ml_stages.specs import ComputeSpec
from tests.conftest import extra_cluster, load_dag, requires_cuda
from tests.operators.test_ray_job import _xcom
from tests.train_data import as_preprocess_xcom, load_split, write_splits

LOGICAL_DATE = datetime(2026, 4, 1, tzinfo=timezone.utc)
SMALL_LIGHTNING = {"family": "lightning", "hidden_sizes": [32, 16], "max_epochs": 12, "patience": 3}
# Shaped like RayTune's best config: extra bookkeeping keys are ignored, missing ones defaulted.
TUNED_XGBOOST = {"family": "xgboost", "max_depth": 4, "eta": 0.15, "num_boost_round": 80, "trial_id": "abc"}


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict:
    return write_splits(tmp_path_factory.mktemp("train-data"), rows=6497, seed=7)


def _run(dag_id: str, splits: dict, config: dict, logical_date: datetime = LOGICAL_DATE):
    return load_dag(dag_id).test(logical_date=logical_date, run_after=logical_date,
                                 run_conf={"data": as_preprocess_xcom(splits), "config": config})


def _predictions_inside(manifest: dict) -> tuple[np.ndarray, np.ndarray]:
    with np.load(Path(manifest["artifact_dir"]) / "evaluation" / "test.npz", allow_pickle=False) as data:
        return data["y_true"], data["y_pred"]


def _assert_trained_well(manifest: dict, splits: dict, family: str) -> None:
    assert manifest["status"] == "succeeded" and manifest["family"] == family
    test, baseline = manifest["metrics"]["test"], manifest["baseline"]["test_rmse"]
    assert test["rmse"] < 0.85 * baseline, (test, baseline)  # a clear margin over the mean predictor
    assert set(manifest["metrics"]["validation"]) == {"rmse", "mae", "acc_0_5", "acc_1_0"}
    assert test["acc_1_0"] > test["acc_0_5"] > 0.3
    model_dir = Path(manifest["model_dir"])
    card = json.loads((model_dir / "model_card.json").read_text())
    assert card["family"] == family and card["model_version"] == manifest["model_version"]
    assert card["feature_columns"] == splits["feature_columns"] and card["label_column"] == "quality"
    assert card["data_fingerprint"] == splits["data_fingerprint"] and card["metrics"] == manifest["metrics"]
    assert card["compute"]["device"] == "cpu" and card["compute"]["gpu_fallback"] is False
    assert "ray" in card["framework_versions"] and card["trained_at"]
    assert (model_dir / "preprocessor.json").read_bytes() == Path(splits["preprocessor_uri"]).read_bytes()
    # Outside Ray, without pickle, the model predicts what the worker predicted inside Ray.
    model = load_model(str(model_dir))
    test_x, test_y = load_split(splits["test_uri"], card["feature_columns"])
    labels_inside, predictions_inside = _predictions_inside(manifest)
    np.testing.assert_array_equal(labels_inside, test_y)
    np.testing.assert_allclose(model.predict(test_x), predictions_inside, rtol=1e-5, atol=1e-5)
    assert model.card.model_version == manifest["model_version"]


@pytest.fixture(scope="module")
def lightning_run(airflow_db, ray_conn, splits):
    """One run of ``train_lightning`` (the probe, then a small Lightning model) on the module's splits."""
    return _run("train_lightning", splits, SMALL_LIGHTNING)


@pytest.mark.integration
def test_train_lightning_with_probed_compute_beats_baseline_and_loads_outside_ray(lightning_run, splits):
    dag_run = lightning_run
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "train")
    _assert_trained_well(manifest, splits, "lightning")
    model_dir = Path(manifest["model_dir"])
    assert json.loads((model_dir / "model_config.json").read_text())["hidden_sizes"] == [32, 16]
    assert manifest["config"]["hidden_sizes"] == [32, 16] and manifest["config"]["lr"] > 0  # defaults filled
    used = manifest["compute_used"]
    assert used["requested"]["reason"].startswith("the Ray cluster advertises no GPU")  # the probe's XCom
    assert used["local_mode"] is True and used["num_workers"] == 0  # right-sized: wine scale
    assert manifest["training"]["runner"] == "in_process"  # local mode without Ray Train


@pytest.mark.integration
def test_train_lightning_rerun_with_same_seed_gives_same_metrics(lightning_run, splits):
    first = _xcom(lightning_run, "train")
    second_run = _run("train_lightning", splits, SMALL_LIGHTNING, logical_date=LOGICAL_DATE + timedelta(days=1))
    second = _xcom(second_run, "train")
    assert second["artifact_dir"] != first["artifact_dir"]  # a new Airflow run: a new run name
    assert second["training"]["run_name"] != first["training"]["run_name"]
    assert second["metrics"] == first["metrics"]


@pytest.mark.integration
def test_train_xgboost_with_tune_config_beats_baseline_and_loads_outside_ray(airflow_db, ray_conn, splits):
    dag_run = _run("train_xgboost", splits, TUNED_XGBOOST)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "train")
    _assert_trained_well(manifest, splits, "xgboost")
    assert (Path(manifest["model_dir"]) / "model.ubj").stat().st_size > 1000
    assert manifest["config"]["max_depth"] == 4 and "trial_id" not in manifest["config"]
    assert manifest["config"]["subsample"] == 0.8  # a default filled in
    # Wine scale on CPU: Train's local mode, run in the job's process without Ray Train.
    assert manifest["compute_used"]["local_mode"] is True and manifest["training"]["runner"] == "in_process"


def _registered_checkpoint(run: str) -> bool:
    """Whether Ray Train's controller has registered a checkpoint of this run (not just received one).

    A checkpoint directory appears while the worker uploads it; the controller registers it only
    when it next polls the worker, and records it in ``checkpoint_manager_snapshot.json``. XGBoost
    reports several rounds between two polls, so only the snapshot says a restart can resume.
    """
    for snapshot in glob.glob(os.path.join(run, "train_runs", "*", "checkpoint_manager_snapshot.json")):
        try:
            if json.loads(Path(snapshot).read_text()).get("latest_checkpoint_result"):
                return True
        except (OSError, json.JSONDecodeError):  # being written
            continue
    return False


def _kill_first_worker_after_a_checkpoint(artifact_root: str, killed: list[int], stop: threading.Event,
                                          dag_id: str = "train_resume") -> None:
    """Wait for the rank-0 worker's pid file and a registered checkpoint, then SIGKILL that worker."""
    deadline = time.monotonic() + 240
    while not stop.is_set() and time.monotonic() < deadline:
        runs = glob.glob(os.path.join(artifact_root, dag_id, "*", "train"))
        for run in runs:
            pids = glob.glob(os.path.join(run, "workers", "rank0-pid*.json"))
            if pids and _registered_checkpoint(run):
                pid = json.loads(Path(pids[0]).read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.05)


def _run_killing_a_worker(dag_id: str, splits: dict, config: dict, artifact_root: str):
    """Run ``dag_id`` while a thread SIGKILLs its first training worker after a checkpoint; return
    the run and the pids killed."""
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_worker_after_a_checkpoint,
                              args=(artifact_root, killed, stop, dag_id))
    killer.start()
    try:
        return _run(dag_id, splits, config), killed
    finally:
        stop.set()
        killer.join()


@pytest.mark.integration
def test_train_worker_killed_mid_run_resumes_from_checkpoint_and_succeeds(airflow_db, ray_conn, splits, artifact_root):
    config = {"family": "lightning", "hidden_sizes": [32, 16], "max_epochs": 12, "patience": 0}
    dag_run, killed = _run_killing_a_worker("train_resume", splits, config, artifact_root)
    assert killed, "the test never saw a worker and a checkpoint to kill"
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "train")
    training = manifest["training"]
    assert training["restarts"] >= 1 and training["worker_starts"] >= 2
    assert training["resumed_from_epoch"] and training["resumed_from_epoch"] >= 1
    assert training["epochs_run"] == 12
    assert manifest["compute_used"]["local_mode"] is False and manifest["compute_used"]["num_workers"] == 1
    assert manifest["metrics"]["test"]["rmse"] < 0.85 * manifest["baseline"]["test_rmse"]
    # Both Lightning packages are installed here: the Ray Train worker took Ray's, lightning.pytorch
    # (with `lightning` hidden: tests/include/test_lightning_package.py).
    versions = ModelCard.read(manifest["model_dir"]).framework_versions
    assert versions["lightning.pytorch"] == version("lightning") and "pytorch_lightning" not in versions, versions


@pytest.mark.integration
def test_train_xgboost_worker_killed_mid_run_resumes_from_the_saved_booster(airflow_db, ray_conn, splits,
                                                                           artifact_root):
    config = {"family": "xgboost", "num_boost_round": 400, "early_stopping_rounds": 0, "max_depth": 4}
    dag_run, killed = _run_killing_a_worker("train_resume_xgboost", splits, config, artifact_root)
    assert killed, "the test never saw a worker and a checkpoint to kill"
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "train")
    training = manifest["training"]
    assert training["runner"] == "ray_train" and training["restarts"] >= 1
    assert training["resumed_from_round"] and training["resumed_from_round"] >= 5
    assert training["rounds_run"] == 400
    assert manifest["metrics"]["test"]["rmse"] < 0.85 * manifest["baseline"]["test_rmse"]


@pytest.mark.integration
def test_train_gpu_spec_without_gpu_falls_back_to_cpu_within_timeout(airflow_db, ray_conn, splits):
    # the session's cluster advertises no GPU, whatever the machine has
    started = time.monotonic()
    dag_run = _run("train_gpu_fallback", splits, TUNED_XGBOOST)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "train")
    used = manifest["compute_used"]
    assert used["gpu_fallback"] is True and used["use_gpu"] is False and used["device"] == "cpu"
    assert "gpu_placement_timeout_s=3" in used["fallback_reason"]
    assert used["requested"]["use_gpu"] is True
    assert manifest["training"]["runner"] == "ray_train"  # one CPU worker after the fallback
    card = json.loads((Path(manifest["model_dir"]) / "model_card.json").read_text())
    assert card["compute"]["gpu_fallback"] is True
    assert manifest["metrics"]["test"]["rmse"] < 0.85 * manifest["baseline"]["test_rmse"]
    assert time.monotonic() - started < 120


@pytest.mark.gpu
@pytest.mark.integration
@requires_cuda
def test_train_lightning_gpu_spec_trains_on_the_gpu(airflow_db, splits):
    import torch

    from airflow_ray_ml_stages.models.lightning_package import import_lightning

    with extra_cluster("ray_gpu", num_cpus=4, num_gpus=None):  # the GPUs Ray finds
        dag_run = _run("train_gpu", splits, SMALL_LIGHTNING)
        assert dag_run.state == "success"
        compute = _xcom(dag_run, "probe")  # the probe's decision is what training was given
        assert compute["use_gpu"] is True, compute["reason"]
        assert compute["devices"][0]["name"] == torch.cuda.get_device_name(0)
        manifest = _xcom(dag_run, "train")
        used = manifest["compute_used"]
        assert used["gpu_fallback"] is False and used["use_gpu"] is True
        assert used["device"].startswith("cuda"), used
        assert used["device_reason"] == "GPU: accelerator='gpu' set in the spec"
        # one worker's work: in the job's process, on the GPU the job was submitted with
        assert manifest["training"]["runner"] == "in_process" and used["num_workers"] == 0
        assert manifest["metrics"]["test"]["rmse"] < 0.85 * manifest["baseline"]["test_rmse"]
        model = load_model(manifest["model_dir"])  # trained on the GPU, loads and predicts on CPU
        # GPU images often have both Lightning packages: the one Ray's classes come from trained it
        assert import_lightning().__name__ in model.card.framework_versions
        test_x, _ = load_split(splits["test_uri"], splits["feature_columns"])
        np.testing.assert_allclose(model.predict(test_x), _predictions_inside(manifest)[1], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.integration
@requires_cuda
def test_train_wine_table_on_gpu_node_trains_on_cpu_with_the_reason(airflow_db, splits):
    with extra_cluster("ray_gpu", num_cpus=4, num_gpus=None):  # the GPUs Ray finds
        dag_run = _run("train_gpu_auto", splits, TUNED_XGBOOST)
        assert dag_run.state == "success"
        assert _xcom(dag_run, "probe")["use_gpu"] is True
        manifest = _xcom(dag_run, "train")
        used = manifest["compute_used"]
        assert used["use_gpu"] is False and used["device"] == "cpu" and used["gpu_fallback"] is False
        assert used["device_reason"].startswith("4,547 rows: CPU is faster for XGBoost below"), used
        assert manifest["training"]["runner"] == "in_process"


def _operator(**kwargs) -> RayTrainOperator:
    from airflow.sdk import DAG

    with DAG(dag_id="train_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        return RayTrainOperator(task_id="train", data=kwargs.pop("data", PREPROCESSED), **kwargs)


PREPROCESSED = {"split_uris": {"train": "/d/train", "validation": "/d/val", "test": "/d/test"},
                "feature_columns": ["a", "b"], "label_column": "quality", "preprocessor_uri": "/d/p.json",
                "preprocessor_variants": {"minmax": "/d/m.json"}, "fingerprint": "f1"}


class _TI:
    dag_id = "train_unit"
    map_index = -1


GPU_COMPUTE = {"use_gpu": True, "gpus_per_worker": 1, "num_workers": 1, "cpus_per_worker": 12, "accelerator": "gpu",
               "reason": "CUDA smoke test passed"}
ROWS = {"read": 6497, "dropped": 0, "train": 4547, "validation": 974, "test": 976}


@pytest.mark.parametrize(("compute", "accelerator", "rows", "gpus"), [
    (GPU_COMPUTE, "gpu", ROWS, 1.0),  # one worker's GPU work: the job's process holds the GPU
    (GPU_COMPUTE, "auto", ROWS, 0.0),  # the device rule keeps the wine table on CPU
    (GPU_COMPUTE, "auto", {**ROWS, "train": 5_000_000}, 1.0),  # a table the GPU wins on
    (GPU_COMPUTE, "gpu", None, 0.0),  # no row counts to plan with: the job plans alone
    (ComputeSpec.cpu("no GPU").to_dict(), "gpu", ROWS, 0.0),
])
def test_train_operator_plans_the_jobs_gpu_from_the_preprocess_rows(tmp_path, compute, accelerator, rows, gpus):
    data = {**PREPROCESSED, **({"rows": rows} if rows else {})}
    operator = _operator(data=data, compute=compute, accelerator=accelerator, config={"family": "xgboost"},
                         artifact_root=str(tmp_path))
    assert operator.job_gpus(operator.full_spec({"ti": _TI(), "run_id": "r1"})) == gpus


def test_train_operator_bad_config_fails_before_any_job(tmp_path):
    operator = _operator(config={"family": "xgboost", "eta": 3}, artifact_root=str(tmp_path))
    with pytest.raises(RayOperatorError, match=r"invalid train spec.*\['eta'\] must be a number in \(0, 1\], got 3"):
        operator.full_spec({"ti": _TI(), "run_id": "r1"})


def test_train_operator_text_rendered_arguments_build_a_valid_spec(tmp_path):
    """What a DAG without render_template_as_native_obj hands over: every value as text."""
    compute = ComputeSpec.cpu("probe said CPU", cpus_per_worker=0.5).to_dict()
    operator = _operator(data=str(PREPROCESSED), config=json.dumps({"family": "xgboost", "max_depth": 3}),
                         compute=str(compute), artifact_root=str(tmp_path), num_workers="1", seed="7",
                         gpu_placement_timeout_s="2.5")
    spec = operator.full_spec({"ti": _TI(), "run_id": "r1"})
    assert spec["config"] == {"max_depth": 3, "family": "xgboost"}
    assert spec["compute"] == compute and spec["num_workers"] == 1 and spec["seed"] == 7
    assert spec["gpu_placement_timeout_s"] == 2.5
    assert spec["train_uri"] == "/d/train" and spec["feature_columns"] == ["a", "b"]
    assert spec["preprocessor_variants"] == {"minmax": "/d/m.json"} and spec["data_fingerprint"] == "f1"
    assert spec["artifact_dir"] == f"{tmp_path}/train_unit/r1/train"
    assert _operator(num_workers="None", artifact_root=str(tmp_path)).full_spec(
        {"ti": _TI(), "run_id": "r1"})["num_workers"] is None


def test_train_operator_takes_the_label_column_from_the_preprocess_xcom(tmp_path):
    operator = _operator(data={**PREPROCESSED, "label_column": "rent"}, artifact_root=str(tmp_path))
    assert operator.full_spec({"ti": _TI(), "run_id": "r1"})["label_column"] == "rent"
    assert "label_column" not in RayTrainOperator.spec_arguments  # named once, at the preprocess task


def test_train_operator_without_the_preprocess_xcom_says_what_to_pass(tmp_path):
    operator = _operator(data={"split_uris": {"train": "/d/train"}}, artifact_root=str(tmp_path))
    with pytest.raises(RayOperatorError, match=r"data lacks \['validation_uri', 'feature_columns', 'label_column', "
                                               r"'preprocessor_uri', 'data_fingerprint', 'test_uri'\].*"
                                               r"data=preprocess.output"):
        operator.full_spec({"ti": _TI(), "run_id": "r1"})


def test_train_operator_template_fields_name_its_arguments():
    operator = _operator()
    for name in RayTrainOperator.template_fields:
        assert hasattr(operator, name), name
    assert {"compute", "config", "data", "num_workers"} <= set(RayTrainOperator.template_fields)
    assert "train_uri" not in RayTrainOperator.template_fields  # it comes from data
    assert ":param max_failures: worker failures Ray Train recovers from" in RayTrainOperator.__doc__
