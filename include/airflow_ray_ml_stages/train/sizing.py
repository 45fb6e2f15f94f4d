"""Right-sizing a training run: GPU or CPU, how many Ray Train workers (0: the job's own process), and
whether the GPU workers' placement can be had."""

from __future__ import annotations

import dataclasses
import os

from airflow_ray_ml_stages.device import DeviceChoice, choose_device
from airflow_ray_ml_stages.specs import ComputeSpec, TrainSpec
from airflow_ray_ml_stages.train.config import ENSEMBLE, SKLEARN_FAMILIES, training_length


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """Where a training run goes: the device, the compute it uses and its workers, each with its reason.

    :param compute: the probe's compute spec, or its CPU form where the device rule keeps the work on CPU.
    :param device: the device rule's choice (the manifest's ``device_reason``).
    :param num_workers: Ray Train workers; 0: the job's own process.
    :param sizing_reason: why that many workers (the manifest's ``sizing_reason``).
    :param data_loading: ``direct`` or ``ray_data`` (the spec's, ``auto`` resolved).
    """

    compute: ComputeSpec
    device: DeviceChoice
    num_workers: int
    sizing_reason: str
    data_loading: str

    @property
    def in_process(self) -> bool:
        """Whether the loop runs in the job's own process, without Ray Train."""
        return self.num_workers == 0 and self.data_loading == "direct"

    @property
    def job_gpus(self) -> float:
        """GPUs the job's own process needs: a GPU run in the job's process trains on the job's GPU."""
        return float(self.compute.gpus_per_worker) if self.compute.use_gpu and self.in_process else 0.0


def plan_training(spec: TrainSpec, train_rows: int, other_rows: int) -> TrainingPlan:
    """The run's device and workers from the spec, the probe's compute spec and the splits' rows.

    The operator plans with the preprocess XCom's row counts before it submits (to give the job
    its GPU); the job plans again with the rows it reads, and both come to the same plan.
    """
    compute = ComputeSpec.from_dict(spec.compute)
    config = spec.resolved_config()
    family = config["family"]
    if family == ENSEMBLE:  # assembled from trained models in the job's process: nothing to place
        reason = "an ensemble of trained models is assembled in the job's process: nothing trains"
        cpu = ComputeSpec.cpu(f"CPU: {reason}", num_workers=compute.num_workers,
                              cpus_per_worker=compute.cpus_per_worker, devices=compute.devices,
                              cluster=compute.cluster, decided_in_s=compute.decided_in_s)
        return TrainingPlan(cpu, DeviceChoice(False, f"CPU: {reason}"), 0, reason, "direct")
    device = choose_device(compute, family=family, rows=train_rows, features=len(spec.feature_columns),
                           iterations=training_length(family, config), accelerator=spec.accelerator)
    if compute.use_gpu and not device.use_gpu:
        compute = ComputeSpec.cpu(device.reason, num_workers=compute.num_workers,
                                  cpus_per_worker=compute.cpus_per_worker, devices=compute.devices,
                                  cluster=compute.cluster, decided_in_s=compute.decided_in_s)
    data_bytes = (train_rows + other_rows) * (len(spec.feature_columns) + 1) * 8
    num_workers, sizing_reason = plan_workers(spec, compute, train_rows, data_bytes)
    data_loading = spec.data_loading
    if data_loading == "auto" or family in SKLEARN_FAMILIES:  # scikit-learn reads its splits itself
        data_loading = "ray_data" if num_workers and train_rows >= spec.scale_out_min_rows else "direct"
    return TrainingPlan(compute, device, num_workers, sizing_reason, data_loading)


def job_holds_gpu() -> bool:
    """Whether Ray gave this job's process a GPU.

    A job submitted with ``entrypoint_num_gpus`` sees its GPU(s) in ``CUDA_VISIBLE_DEVICES``; one
    submitted with other entrypoint resources sees none (the variable empty), and one submitted
    with none at all may see every GPU, but holds none of them (the variable unset).
    """
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip())


def plan_workers(spec: TrainSpec, compute: ComputeSpec, train_rows: int, data_bytes: int) -> tuple[int, str]:
    """How many Ray Train workers to use (0: Train's local mode), and why (right-sizing).

    Below ``scale_out_min_rows`` the run is small enough that Ray Train's fixed start-up (a
    controller and worker actors that import torch/xgboost again) costs more than the training:
    it runs in the job's own process, on CPU or on the GPU given to the job. From
    ``scale_out_min_rows`` the compute spec's workers are used, except a plan of one worker: one
    Train worker fed by Ray Data does the job process's work plus both start-ups (measured on
    454,790 training rows: XGBoost 21.5 s against 2.5 s in the job's process), so while the splits
    (``data_bytes`` in memory) fit ``direct_max_bytes`` it trains in the job's process too. A forest
    (or the linear model) always trains in the job's process.
    """
    family = spec.resolved_config()["family"]
    if family in SKLEARN_FAMILIES:
        return 0, f"scikit-learn's {family} trains in one process (using its cores), never on Ray Train"
    if spec.num_workers is not None:
        return spec.num_workers, f"num_workers={spec.num_workers} set in the spec"
    if train_rows < spec.scale_out_min_rows:
        return 0, (f"{train_rows} training rows < scale_out_min_rows={spec.scale_out_min_rows}: Train's local "
                   "mode (in the job's process), since Ray Train's fixed start-up cost dominates at this size")
    if compute.num_workers <= 1 and data_bytes <= spec.direct_max_bytes:
        device = "GPU" if compute.use_gpu else "CPU"
        return 0, (f"{train_rows} training rows >= scale_out_min_rows={spec.scale_out_min_rows}, but the compute "
                   f"spec plans one {device} worker and the splits ({data_bytes / 2**20:,.0f} MiB in memory) fit "
                   f"direct_max_bytes={spec.direct_max_bytes:,}: Train's local mode (in the job's process), since "
                   "one Ray Train worker would add only its and Ray Data's start-up")
    return compute.num_workers, (f"{train_rows} training rows >= scale_out_min_rows={spec.scale_out_min_rows}: "
                                 f"the compute spec's {compute.num_workers} worker(s)")


def gpu_placement_available(num_workers: int, cpus: float, gpus: float, timeout_s: float) -> bool:
    """Whether ``num_workers`` bundles of CPUs+GPUs can be placed within ``timeout_s``; releases them."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": cpus, "GPU": gpus}] * max(1, num_workers), strategy="PACK")
    try:
        return bool(group.wait(timeout_seconds=timeout_s))
    finally:
        remove_placement_group(group)
