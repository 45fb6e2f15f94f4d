"""Which device a stage's work runs on: the probe's answer and the size of the work, decided in one place.

The probe (:mod:`airflow_ray_ml_stages.probe`) says whether the cluster has a GPU that works; it
does not say whether a given piece of work is worth sending there. Small tables train faster on
CPU: a GPU adds its context start-up and host-to-device copies, and on a few thousand rows each
epoch's or round's kernels are too small to keep it busy. :func:`choose_device` weighs the work
(rows x features, model family, epochs or rounds) against thresholds measured by
``bench/bench_gpu.py`` (docs/benchmarks.md), and every stage that acts on the probe's answer asks
it, so training, tuning and their manifests agree.

``accelerator`` overrides the rule: ``gpu`` uses the GPU whenever the probe found one, ``cpu``
never does, ``auto`` (the default) follows the rule.
"""

from __future__ import annotations

import dataclasses
import math

from airflow_ray_ml_stages.constants import ACCELERATOR_CHOICES
from airflow_ray_ml_stages.specs import ComputeSpec
from airflow_ray_ml_stages.spec_base import require_choice, require_int_range
from airflow_ray_ml_stages.train.config import FAMILIES, SKLEARN_FAMILIES

# The thresholds: the one place they are set. Initial values, to be replaced by bench/bench_gpu.py's
# measurements on a GPU node (docs/benchmarks.md, "GPU"): XGBoost trials on the 6.5k-row wine table
# ran 1.5-2.4x slower on an H200 than on 16 cores, and the published Lightning-on-GPU comparisons of
# a small MLP win only from ~100x the wine rows (650k rows of 12 features).
GPU_MIN_CELLS: dict[str, int] = {
    "lightning": 8_000_000,  # ~650k wine rows: a 64-32 MLP's batches start to fill the GPU
    "xgboost": 6_000_000,  # ~500k wine rows: GPU hist beats 16 cores' hist from about here
}
"""Training rows x features from which one epoch (Lightning) or round (XGBoost) runs faster on the
GPU than on the node's CPUs."""

GPU_MIN_WORK = 100_000_000
"""Training rows x features x epochs (or rounds) from which the GPU's fixed start-up (its CUDA
context, the table copied to it: ~2 s) is earned back; below it a short run on a large table stays
on CPU."""

_FAMILY_NAMES = {"lightning": "Lightning", "xgboost": "XGBoost"}
_ITERATION_NAMES = {"lightning": "epochs", "xgboost": "rounds"}


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Where one stage's work runs, and why (the manifest's ``device_reason``)."""

    use_gpu: bool
    reason: str


def gpu_min_rows(family: str, features: int) -> int:
    """The fewest training rows of ``features`` features that ``family`` trains faster on the GPU."""
    return math.ceil(GPU_MIN_CELLS[family] / max(1, features))


def choose_device(compute: ComputeSpec, *, family: str, rows: int, features: int, iterations: int,
                  accelerator: str = "auto") -> DeviceChoice:
    """GPU or CPU for training ``family`` on ``rows`` x ``features`` for ``iterations`` epochs or rounds.

    :param compute: the probe's compute spec; without a usable GPU the answer is always CPU.
    :param family: the model family (``lightning``, ``xgboost``, or a scikit-learn one: always CPU).
    :param rows: training rows.
    :param features: feature columns the model takes.
    :param iterations: epochs (lightning), boosting rounds (xgboost) or trees (a forest) at most.
    :param accelerator: ``auto`` (the rule), ``gpu`` or ``cpu`` (overrides).
    """
    require_choice("choose_device", "family", family, FAMILIES)
    require_choice("choose_device", "accelerator", accelerator, ACCELERATOR_CHOICES)
    require_int_range("choose_device", "rows", rows, 0)
    require_int_range("choose_device", "features", features, 1)
    require_int_range("choose_device", "iterations", iterations, 1)
    if family in SKLEARN_FAMILIES:
        return DeviceChoice(False, f"CPU: scikit-learn's {family} has no GPU implementation")
    if not compute.use_gpu:
        return DeviceChoice(False, f"CPU: the probe found no usable GPU ({compute.reason})")
    if accelerator == "cpu":
        return DeviceChoice(False, "CPU: accelerator='cpu' set in the spec")
    if accelerator == "gpu":
        return DeviceChoice(True, "GPU: accelerator='gpu' set in the spec")
    name, threshold = _FAMILY_NAMES[family], gpu_min_rows(family, features)
    if rows < threshold:
        return DeviceChoice(False, f"{rows:,} rows: CPU is faster for {name} below {threshold:,} rows of "
                                   f"{features} features on this node (accelerator='gpu' uses the GPU anyway)")
    work = rows * features * iterations
    if work < GPU_MIN_WORK:
        return DeviceChoice(False, f"{rows:,} rows x {features} features x {iterations} {_ITERATION_NAMES[family]}: "
                                   f"too little work to earn back the GPU's start-up (below {GPU_MIN_WORK:,}); "
                                   "CPU")
    return DeviceChoice(True, f"{rows:,} rows: the GPU is faster for {name} from {threshold:,} rows of "
                              f"{features} features on this node")
