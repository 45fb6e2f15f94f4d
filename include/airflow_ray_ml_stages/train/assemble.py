"""The train stage for an ensemble (``config`` of family ``ensemble``): assemble it, nothing trains.

The tune stage's ensemble selection (:mod:`airflow_ray_ml_stages.ensemble`) names trained trials
and their weights; this copies their model directories into the run's model directory, scores
the ensemble on the validation and test splits as any trained model is scored, and writes its
card (family ``ensemble``: the members, their weights and validation metrics).
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timezone

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.ensemble import assemble, ensemble_card
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, task_metrics
from airflow_ray_ml_stages.models import load_model
from airflow_ray_ml_stages.preprocessor import input_types_of
from airflow_ray_ml_stages.specs import TrainResult, TrainSpec
from airflow_ray_ml_stages.train.finish import baseline_metrics
from airflow_ray_ml_stages.train.run_dir import write_split_evaluation, write_test_predictions
from airflow_ray_ml_stages.train.splits import label_stats, read_split

log = logging.getLogger("airflow_ray_ml_stages.train")


def run_assembly(spec: TrainSpec, started: float) -> TrainResult:
    """Assemble the ensemble ``spec.config`` names into ``<artifact_dir>/<model_subdir>`` and score it."""
    config = spec.resolved_config()
    model_dir = artifacts.join(spec.artifact_dir, spec.model_subdir)
    columns = [*spec.feature_columns, spec.label_column]
    train_rows, label_mean, _, class_priors = label_stats(spec.train_uri, spec.label_column, columns, spec.classes)
    listed = assemble(config["members"], model_dir, spec.preprocessor_uri)
    card_config = {"members": listed}
    model_version = f"ensemble-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    # A provisional card lets load_model read the members; the final one adds the metrics.
    ensemble_card(spec, listed, metrics={}).write(model_dir)
    model = load_model(model_dir)
    fit_started = time.monotonic()
    metrics, evaluated = {}, {}
    for split, uri in (("validation", spec.validation_uri), ("test", spec.test_uri)):
        x, y = read_split(uri, list(spec.feature_columns), spec.label_column)
        evaluated[split] = y, model.predict(x)
        write_split_evaluation(spec.artifact_dir, split, *evaluated[split])
        metrics[split] = task_metrics(spec.task, *evaluated[split])
    test_labels, test_predictions = evaluated["test"]
    write_test_predictions(model_dir, spec.task, test_labels, test_predictions)
    baseline = baseline_metrics(test_labels, label_mean, class_priors)
    reason = f"an ensemble of {len(listed)} trained models: assembled from their directories, nothing trains"
    compute_used = {"use_gpu": False, "accelerator": "cpu", "device": "cpu", "num_workers": 0, "local_mode": True,
                    "data_loading": "direct", "cpus_per_worker": 1, "gpus_per_worker": 0, "gpu_fallback": False,
                    "placement_strategy": spec.placement_strategy, "worker_nodes": [], "fallback_reason": None,
                    "sizing_reason": reason, "device_reason": f"CPU: {reason}",
                    "requested": {key: spec.compute.get(key) for key in ("use_gpu", "num_workers", "cpus_per_worker",
                                                                         "gpus_per_worker", "accelerator", "reason")}}
    training = {"members": len(listed), "train_rows": train_rows, "runner": "assemble", "worker_starts": 0,
                "restarts": 0, "fit_s": round(time.monotonic() - fit_started, 3),
                "stage_s": round(time.monotonic() - started, 3)}
    versions: dict[str, str] = {}
    for _, member, _ in model.members:
        versions.update(member.card.framework_versions or {})
    input_types = input_types_of(artifacts.read_bytes(spec.preprocessor_uri)) if spec.preprocessor_uri else None
    ensemble_card(spec, listed, metrics=metrics, model_version=model_version,
                  trained_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), baseline=baseline,
                  compute=compute_used, training=training, framework_versions=versions or None,
                  input_types=input_types).write(model_dir)
    metric = DEFAULT_METRIC[spec.task]
    log.info("assembled ensemble %s of %s: test %s %.4f (baseline %.4f), validation %s %.4f", model_version,
             ", ".join(f"{member.get('trial_id', member['dir'])} ({member.get('family')}) x {member['weight']:.2f}"
                       for member in listed),
             metric, metrics["test"][metric], baseline[f"test_{metric}"], metric, metrics["validation"][metric])
    return TrainResult(model_dir=model_dir, family="ensemble", metrics=metrics, baseline=baseline, config=card_config,
                       model_version=model_version, compute_used=compute_used, training=training,
                       data_fingerprint=spec.data_fingerprint, task=spec.task, classes=spec.classes)
