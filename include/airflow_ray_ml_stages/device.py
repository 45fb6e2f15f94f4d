"""Which device a stage's work runs on: the probe's answer and the size of the work, decided in one place.

The probe (:mod:`airflow_ray_ml_stages.probe`) says whether the cluster has a GPU that works; it
does not say whether a given piece of work is worth sending there. Small tables train faster on
CPU: a GPU adds its context start-up and host-to-device copies, which a few thousand rows never
earn back. :func:`choose_device` weighs the work (rows x features, model family, epochs or rounds)
against thresholds measured by ``bench/bench_gpu.py`` (docs/benchmarks.md), and every stage that
acts on the probe's answer asks it, so training, tuning and their manifests agree.

``accelerator`` overrides the rule: ``gpu`` uses the GPU whenever the probe found one, ``cpu``
never does, ``auto`` (the default) follows the rule.
"""

from __future__ import annotations

import dataclasses

from airflow_ray_ml_stages.constants import ACCELERATOR_CHOICES  # noqa: F401  (what ``accelerator`` may say)
from airflow_ray_ml_stages.specs import ComputeSpec


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """Where one stage's work runs, and why (the manifest's ``device_reason``)."""

    use_gpu: bool
    reason: str


def choose_device(compute: ComputeSpec, *, family: str, rows: int, features: int, iterations: int,
                  accelerator: str = "auto") -> DeviceChoice:
    """GPU or CPU for training ``family`` on ``rows`` x ``features`` for ``iterations`` epochs or rounds.

    :param compute: the probe's compute spec; without a usable GPU the answer is always CPU.
    :param family: the model family (``lightning``, ``xgboost``).
    :param rows: training rows.
    :param features: feature columns the model takes.
    :param iterations: epochs (lightning) or boosting rounds (xgboost) at most.
    :param accelerator: ``auto`` (the rule), ``gpu`` or ``cpu`` (overrides).
    """
    if not compute.use_gpu:
        return DeviceChoice(False, f"CPU: the probe found no usable GPU ({compute.reason})")
    if accelerator == "cpu":
        return DeviceChoice(False, "CPU: accelerator='cpu' set in the spec")
    if accelerator == "gpu":
        return DeviceChoice(True, "GPU: accelerator='gpu' set in the spec")
    # placeholder rule, replaced by the thresholds measured with bench/bench_gpu.py
    return DeviceChoice(True, f"GPU: {rows:,} rows x {features} features of {family}")
