"""After the loop: metrics and a baseline that ignores the features, from what it wrote, and the model card.

:func:`finish` reads the run's evaluation files, writes the
:class:`~airflow_ray_ml_stages.model_card.ModelCard` (and the preprocessor
the features were scaled with) into the model directory, and returns the stage's result.
"""

from __future__ import annotations

import json
import logging
import platform
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, task_metrics
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.models import PREPROCESSOR
from airflow_ray_ml_stages.preprocessor import input_types_of
from airflow_ray_ml_stages.specs import ComputeSpec, TrainResult, TrainSpec
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig
from airflow_ray_ml_stages.train.run_dir import (read_evaluation, read_final, run_name, worker_record_uris,
                                                 write_test_predictions)

log = logging.getLogger("airflow_ray_ml_stages.train")


def _framework_versions(family: str, loop_versions: dict[str, str]) -> dict[str, str]:
    from importlib.metadata import version

    # The installed versions without importing the packages: after a Ray Train run the driver has
    # imported neither torch nor Lightning, and importing them just for this took seconds.
    versions = {"python": platform.python_version(), "ray": version("ray"), "numpy": np.__version__}
    if family == "xgboost":
        versions["xgboost"] = _installed("xgboost")
    else:
        # What the loop imported (torch and which Lightning package, both may be installed; scikit-learn)
        versions.update(loop_versions)
    return versions


def _installed(module: str) -> str:
    """A package's version: the imported module's where it is loaded, else its installed distribution's."""
    import sys
    from importlib.metadata import version

    loaded = sys.modules.get(module)
    return getattr(loaded, "__version__", None) or version(module)


def finish(spec: TrainSpec, compute: ComputeSpec, loop_config: TrainLoopConfig, train_rows: int, started: float,
           preprocessor_uri: str | None, *, fit_s: float, runner: str, num_workers: int, sizing_reason: str,
           device_reason: str, use_gpu: bool, gpus_per_worker: float, fallback_reason: str | None) -> TrainResult:
    """Metrics, baseline and model card from what the training loop wrote; the stage's result."""
    config, label_mean = loop_config.config, loop_config.label_mean
    family, local_mode, data_loading = loop_config.family, num_workers == 0, loop_config.data_loading
    cpus_per_worker, model_dir = compute.cpus_per_worker, loop_config.model_dir
    final = read_final(spec.artifact_dir)

    task = spec.task
    evaluated = {split: read_evaluation(spec.artifact_dir, split) for split in ("validation", "test")}
    metrics = {split: task_metrics(task, labels, predictions) for split, (labels, predictions) in evaluated.items()}
    test_labels, test_predictions = evaluated["test"]
    write_test_predictions(model_dir, task, test_labels, test_predictions)
    baseline = baseline_metrics(test_labels, label_mean, loop_config.class_priors)
    worker_records = [artifacts.read_json(f"{uri}") for uri in worker_record_uris(spec.artifact_dir)]
    worker_starts = len(worker_records)
    compute_used = {
        "use_gpu": use_gpu, "accelerator": "gpu" if use_gpu else "cpu", "device": final.get("device"),
        "num_workers": num_workers, "local_mode": local_mode, "data_loading": data_loading, "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker, "gpu_fallback": fallback_reason is not None,
        "placement_strategy": spec.placement_strategy,
        "worker_nodes": sorted({r["node_id"] for r in worker_records if r.get("node_id")}),
        "fallback_reason": fallback_reason, "sizing_reason": sizing_reason, "device_reason": device_reason,
        "requested": {key: spec.compute.get(key) for key in ("use_gpu", "num_workers", "cpus_per_worker",
                                                             "gpus_per_worker", "accelerator", "reason")},
    }
    training = {
        **{key: value for key, value in final.items() if key not in ("device", "framework_versions")},
        "train_rows": train_rows, "worker_starts": worker_starts,
        "restarts": max(0, worker_starts - max(1, num_workers)), "run_name": run_name(spec.artifact_dir),
        "checkpoint_every": loop_config.checkpoint_interval(), "fit_s": round(fit_s, 3), "runner": runner,
        "stage_s": round(time.monotonic() - started, 3),
    }
    model_version = f"{family}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    input_types = None
    if preprocessor_uri:
        preprocessor_json = artifacts.read_bytes(preprocessor_uri)
        artifacts.write_bytes_atomic(artifacts.join(model_dir, PREPROCESSOR), preprocessor_json)
        input_types = input_types_of(preprocessor_json)
    if spec.scaler:
        config = {**config, "scaler": spec.scaler}  # recorded; the booster never saw it
    ModelCard(
        family=family, feature_columns=list(spec.feature_columns), label_column=spec.label_column,
        task=task, classes=spec.classes,
        config=config, metrics=metrics, seed=spec.seed, data_fingerprint=spec.data_fingerprint,
        preprocessor=PREPROCESSOR if preprocessor_uri else None, model_version=model_version,
        trained_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), baseline=baseline,
        compute=compute_used, training=training,
        framework_versions=_framework_versions(family, final.get("framework_versions", {})),
        input_types=input_types,
    ).write(model_dir)
    metric = DEFAULT_METRIC[task]
    log.info("trained %s %s: test %s %.4f (baseline %.4f), validation %s %.4f; %s", family, model_version,
             metric, metrics["test"][metric], baseline[f"test_{metric}"], metric, metrics["validation"][metric],
             json.dumps(training, sort_keys=True))
    return TrainResult(model_dir=model_dir, family=family, metrics=metrics, baseline=baseline, config=config,
                       model_version=model_version, compute_used=compute_used, training=training,
                       data_fingerprint=spec.data_fingerprint, task=task, classes=spec.classes)


def baseline_metrics(test_labels: np.ndarray, label_mean: float, class_priors: list[float] | None) -> dict[str, Any]:
    """The test metrics of the model that ignores the features: the training mean, or the training class shares."""
    if class_priors is None:
        return {"test_rmse": task_metrics("regression", test_labels, np.full_like(test_labels, label_mean))["rmse"],
                "train_label_mean": label_mean}
    shares = np.tile(np.asarray(class_priors, dtype=np.float64), (len(test_labels), 1))
    found = task_metrics("classification", test_labels, shares)
    return {"test_log_loss": found["log_loss"], "test_accuracy": found["accuracy"],
            "train_class_shares": list(class_priors)}
