"""The ``train`` stage's entry: :func:`run_training` (``python -m airflow_ray_ml_stages.train --spec '<json>'``).

It right-sizes the run (:mod:`airflow_ray_ml_stages.train.sizing`), then runs the family's loop
(:mod:`airflow_ray_ml_stages.train.loops`) in the job's own process or on Ray Train workers, and finishes with
the metrics and the model card (:mod:`airflow_ray_ml_stages.train.finish`).
"""

from __future__ import annotations

import logging
import os
import time

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.capacity import bundles_placeable, fit_workers, fixes, live_capacity, waiting_reason
from airflow_ray_ml_stages.constants import JOB_ENV_VARS, WAITING_NAME
from airflow_ray_ml_stages.errors import ResourcesUnavailableError
from airflow_ray_ml_stages.preprocessor import feature_fill
from airflow_ray_ml_stages.specs import TrainResult, TrainSpec
from airflow_ray_ml_stages.stage import run_stage
from airflow_ray_ml_stages.train.config import ENSEMBLE
from airflow_ray_ml_stages.train.contexts import InProcessTrainContext
from airflow_ray_ml_stages.train.failures import deterministic_errors_fail_once
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig
from airflow_ray_ml_stages.train.loops import TRAIN_LOOPS, lightning_train_loop, xgboost_train_loop
from airflow_ray_ml_stages.train.finish import finish
from airflow_ray_ml_stages.train.run_dir import run_name, storage_path
from airflow_ray_ml_stages.train.sizing import gpu_placement_available, job_holds_gpu, plan_training
from airflow_ray_ml_stages.train.splits import SPLITS, ParquetSplit, label_stats, scaler_plan

log = logging.getLogger("airflow_ray_ml_stages.train")


def run_training(spec: TrainSpec) -> TrainResult:
    """Train the spec's model family on the connected Ray cluster and write its model directory."""
    started = time.monotonic()
    config = spec.resolved_config()
    family = config["family"]
    if family == ENSEMBLE:
        from airflow_ray_ml_stages.train.assemble import run_assembly

        return run_assembly(spec, started)
    columns = [*spec.feature_columns, spec.label_column]
    train_rows, label_mean, label_std, class_priors = label_stats(spec.train_uri, spec.label_column, columns, spec.classes)
    other_rows = sum(ParquetSplit(uri, columns).num_rows for uri in (spec.validation_uri, spec.test_uri))
    plan = plan_training(spec, train_rows, other_rows)
    compute, num_workers, sizing_reason, device_reason = (plan.compute, plan.num_workers, plan.sizing_reason,
                                                          plan.device.reason)
    log.info("device: %s", device_reason)
    log.info("right-sizing: %s", sizing_reason)
    affine, preprocessor_uri = scaler_plan(spec.preprocessor_uri, spec.preprocessor_variants, spec.scaler,
                                           spec.feature_columns)
    # missing values (nan_policy impute): XGBoost takes the splits' NaN as missing itself, the others impute
    fill = None if family == "xgboost" else feature_fill(spec.preprocessor_uri, list(spec.feature_columns))
    if affine:
        log.info("scaler %r: features mapped from the written splits with the variant %s", spec.scaler, preprocessor_uri)
    data_loading = plan.data_loading
    model_dir = artifacts.join(spec.artifact_dir, spec.model_subdir)
    uris = dict(zip(SPLITS, (spec.train_uri, spec.validation_uri, spec.test_uri)))
    in_process_gpu = plan.in_process and compute.use_gpu and job_holds_gpu()
    if plan.in_process and compute.use_gpu and not in_process_gpu:
        log.info("the job's process was given no GPU (RayTrainOperator submits it with entrypoint_num_gpus): "
                 "training on one Ray Train GPU worker instead")
    if plan.in_process and (in_process_gpu or not compute.use_gpu):
        # Train's local mode runs the loop in this process anyway: run it without Ray Train, so
        # the job neither connects to Ray nor imports Ray Train (most of a wine-scale run's time).
        # On GPU the job was given the GPU when it was submitted, so no worker needs to hold one.
        artifacts.makedirs(model_dir)
        loop_config = TrainLoopConfig(
            config=config, feature_columns=list(spec.feature_columns), label_column=spec.label_column,
            label_mean=label_mean, label_std=label_std, seed=spec.seed, use_gpu=in_process_gpu, local_mode=True,
            threads=max(1, int(compute.cpus_per_worker)), checkpoint_every=spec.checkpoint_every,
            artifact_dir=spec.artifact_dir, model_dir=model_dir, uris=uris, data_loading=data_loading,
            feature_affine=affine, feature_fill=fill, class_priors=class_priors,
        )
        log.info("training %s on %s in the job's process (Train's local mode without Ray Train), data: direct",
                 family, "GPU" if in_process_gpu else "CPU")
        fit_started = time.monotonic()
        TRAIN_LOOPS[family](loop_config, InProcessTrainContext())
        return finish(spec, compute, loop_config, train_rows, started, preprocessor_uri,
                       fit_s=time.monotonic() - fit_started, runner="in_process", num_workers=0,
                       sizing_reason=sizing_reason, device_reason=device_reason, use_gpu=in_process_gpu,
                       gpus_per_worker=compute.gpus_per_worker if in_process_gpu else 0, fallback_reason=None)
    import ray
    import ray.data
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig

    # The operator's job sets Train's report interval (JOB_ENV_VARS); run any other way, set it here
    # so that every report does not wait ~2 s for the controller's poll.
    missing_env = {key: value for key, value in JOB_ENV_VARS.items() if key not in os.environ}
    ray.init(address="auto", logging_level=logging.WARNING,
             runtime_env={"env_vars": missing_env} if missing_env else None)
    use_gpu, gpus_per_worker, fallback_reason = compute.use_gpu, compute.gpus_per_worker, None
    cpus_per_worker = compute.cpus_per_worker
    if use_gpu:
        workers = max(1, num_workers)
        waited = time.monotonic()
        if gpu_placement_available(workers, cpus_per_worker, gpus_per_worker, spec.gpu_placement_timeout_s):
            num_workers = workers  # Train's local mode holds no GPU: a job given none trains on a GPU worker
        else:
            use_gpu, gpus_per_worker = False, 0
            fallback_reason = (
                f"no placement for {workers} worker(s) x {compute.gpus_per_worker:g} GPU + "
                f"{cpus_per_worker:g} CPU within gpu_placement_timeout_s={spec.gpu_placement_timeout_s:g} s "
                f"(waited {time.monotonic() - waited:.1f} s); training on CPU instead"
            )
            log.warning("GPU fallback: %s", fallback_reason)
    local_mode = num_workers == 0
    if not local_mode:
        cpus_per_worker, cut = fit_workers(live_capacity(), num_workers, cpus_per_worker)
        if cut:
            log.info("worker CPUs sized to what is free: %s", cut)
        _wait_for_workers(spec, num_workers, cpus_per_worker, gpus_per_worker if use_gpu else 0)

    artifacts.makedirs(model_dir)
    loop_config = TrainLoopConfig(
        config=config, feature_columns=list(spec.feature_columns), label_column=spec.label_column,
        label_mean=label_mean, label_std=label_std, seed=spec.seed, use_gpu=use_gpu, local_mode=local_mode,
        threads=max(1, int(cpus_per_worker)), checkpoint_every=spec.checkpoint_every,
        artifact_dir=spec.artifact_dir, model_dir=model_dir, uris=uris, data_loading=data_loading,
        feature_affine=affine, feature_fill=fill, class_priors=class_priors,
    )
    datasets = None
    if data_loading == "ray_data":
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the same rows in the same order: same metrics
        context.enable_progress_bars = False
        # Parquet's first reader: the file list and footers come from the driver at read_parquet,
        # where the default reader runs a listing task and a footer-reading actor first, each in a
        # new worker process (seconds each on a small node) before the first row is read.
        context.use_datasource_v2 = False
        # Only the training split goes through Ray Data (sharded across the workers); the evaluation
        # splits are small and every worker wants them whole, so the loop reads them directly.
        datasets = {"train": ray.data.read_parquet(uris["train"], columns=columns)}
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if use_gpu else {})}
    common = dict(
        train_loop_config=loop_config.to_dict(),  # Ray Train carries a plain dict
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=None if local_mode else resources,
                                     placement_strategy=spec.placement_strategy),
        run_config=RunConfig(
            name=run_name(spec.artifact_dir), storage_path=storage_path(spec.artifact_dir),
            failure_config=FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=["train"]) if datasets else None,
    )
    log.info("training %s on %s: %s worker(s) x %s (local mode: %s, data: %s), run %s", family,
             "GPU" if use_gpu else "CPU", num_workers, resources, local_mode, data_loading,
             run_name(spec.artifact_dir))
    if family == "lightning":
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(lightning_train_loop, **common)
    else:
        from ray.train.xgboost import XGBoostTrainer

        trainer = XGBoostTrainer(xgboost_train_loop, **common)
    fit_started = time.monotonic()
    trainer.fit()
    return finish(spec, compute, loop_config, train_rows, started, preprocessor_uri,
                   fit_s=time.monotonic() - fit_started, runner="ray_train", num_workers=num_workers,
                   sizing_reason=sizing_reason, device_reason=device_reason, use_gpu=use_gpu,
                   gpus_per_worker=gpus_per_worker, fallback_reason=fallback_reason)


def _wait_for_workers(spec: TrainSpec, workers: int, cpus: float, gpus: float) -> None:
    """Fail with what holds the cluster's resources when the worker group cannot be placed within
    ``resource_wait_s`` (Ray Train itself would retry its start-up for as long as the task runs)."""
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    first_look_s = min(5.0, spec.resource_wait_s)  # a free cluster places them at once
    if bundles_placeable([bundle] * workers, spec.placement_strategy, first_look_s):
        return
    reason = waiting_reason(live_capacity(), what="worker", cpus=cpus, gpus=gpus)
    log.warning("%d worker(s) waiting for resources: %s", workers, reason)
    waiting = artifacts.join(spec.artifact_dir, WAITING_NAME)
    artifacts.write_json_atomic(waiting, {"state": "pending", "what": "workers", "reason": reason, "since": time.time()})
    placed = bundles_placeable([bundle] * workers, spec.placement_strategy, spec.resource_wait_s - first_look_s)
    artifacts.write_json_atomic(waiting, {"state": "running", "what": "workers", "reason": "", "since": time.time()})
    if placed:
        return
    reason = waiting_reason(live_capacity(), what="worker", cpus=cpus, gpus=gpus)
    raise ResourcesUnavailableError(
        f"{workers} Ray Train worker(s) could not start within resource_wait_s={spec.resource_wait_s:g} s: {reason}. "
        f"Fix: {fixes('num_workers (the train_workers Param)')}"
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(TrainSpec, deterministic_errors_fail_once(run_training), argv)
