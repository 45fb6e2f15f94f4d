"""The device rule: GPU or CPU from the probe's answer and the size of the work, with the spec's overrides."""

from __future__ import annotations

import pytest

from airflow_ray_ml_stages.device import GPU_MIN_CELLS, GPU_MIN_WORK, choose_device, gpu_min_rows
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.specs import ComputeSpec

GPU = ComputeSpec(use_gpu=True, gpus_per_worker=1, num_workers=1, cpus_per_worker=12, accelerator="gpu",
                  reason="CUDA smoke test passed on NVIDIA H200")
CPU = ComputeSpec.cpu("the Ray cluster advertises no GPU (1 node(s), 16 CPUs)")
WINE_FEATURES = 13  # eleven measurements and the one-hot wine type


@pytest.mark.parametrize("family", ["lightning", "xgboost"])
def test_choose_device_wine_table_on_gpu_node_runs_on_cpu_with_the_threshold(family):
    choice = choose_device(GPU, family=family, rows=4553, features=WINE_FEATURES, iterations=200)
    threshold = gpu_min_rows(family, WINE_FEATURES)
    assert choice.use_gpu is False
    name = {"lightning": "Lightning", "xgboost": "XGBoost"}[family]
    assert choice.reason.startswith(f"4,553 rows: CPU is faster for {name} below {threshold:,} rows")


@pytest.mark.parametrize("family", ["lightning", "xgboost"])
def test_choose_device_from_the_threshold_on_gpu_node_runs_on_gpu(family):
    threshold = gpu_min_rows(family, WINE_FEATURES)
    below = choose_device(GPU, family=family, rows=threshold - 1, features=WINE_FEATURES, iterations=100)
    at = choose_device(GPU, family=family, rows=threshold, features=WINE_FEATURES, iterations=100)
    assert (below.use_gpu, at.use_gpu) == (False, True)
    assert f"{threshold:,} rows: the GPU is faster" in at.reason


def test_choose_device_more_features_lower_the_row_threshold():
    wide, narrow = gpu_min_rows("xgboost", 130), gpu_min_rows("xgboost", WINE_FEATURES)
    assert wide * 130 >= GPU_MIN_CELLS["xgboost"] and (wide - 1) * 130 < GPU_MIN_CELLS["xgboost"]
    assert wide < narrow
    assert choose_device(GPU, family="xgboost", rows=wide, features=130, iterations=100).use_gpu
    assert not choose_device(GPU, family="xgboost", rows=wide, features=WINE_FEATURES, iterations=100).use_gpu


def test_choose_device_large_table_for_few_epochs_stays_on_cpu():
    rows = gpu_min_rows("lightning", WINE_FEATURES)
    too_few = GPU_MIN_WORK // (rows * WINE_FEATURES)  # the most epochs that do not earn back the start-up
    assert too_few >= 1
    short = choose_device(GPU, family="lightning", rows=rows, features=WINE_FEATURES, iterations=too_few)
    longer = choose_device(GPU, family="lightning", rows=rows, features=WINE_FEATURES, iterations=too_few + 1)
    assert (short.use_gpu, longer.use_gpu) == (False, True)
    assert f"x {too_few} epochs: too little work to earn back the GPU's start-up" in short.reason


@pytest.mark.parametrize("accelerator", ["auto", "gpu", "cpu"])
def test_choose_device_without_usable_gpu_always_cpu_with_the_probes_reason(accelerator):
    choice = choose_device(CPU, family="lightning", rows=10**8, features=50, iterations=100, accelerator=accelerator)
    assert choice.use_gpu is False
    assert choice.reason == f"CPU: the probe found no usable GPU ({CPU.reason})"


def test_choose_device_accelerator_gpu_puts_small_work_on_the_gpu():
    choice = choose_device(GPU, family="xgboost", rows=100, features=3, iterations=1, accelerator="gpu")
    assert choice.use_gpu is True and "accelerator='gpu'" in choice.reason


def test_choose_device_accelerator_cpu_keeps_large_work_off_the_gpu():
    choice = choose_device(GPU, family="lightning", rows=10**8, features=50, iterations=100, accelerator="cpu")
    assert choice.use_gpu is False and "accelerator='cpu'" in choice.reason


def test_choose_device_required_gpu_small_work_stays_on_cpu_and_says_how_to_force():
    # require_gpu=True makes the probe fail without a usable GPU; with one, the probe's answer is
    # this GPU spec and the rule still keeps work the GPU would slow on CPU.
    choice = choose_device(GPU, family="xgboost", rows=4553, features=WINE_FEATURES, iterations=1000)
    assert choice.use_gpu is False and "accelerator='gpu' uses the GPU anyway" in choice.reason


@pytest.mark.parametrize(("field", "value", "message"), [
    ("family", "sklearn", r"choose_device.family must be one of \['lightning', 'xgboost', 'extra_trees', "
                          r"'random_forest', 'linear'\], got 'sklearn'"),
    ("accelerator", "cuda", r"choose_device.accelerator must be one of \['auto', 'gpu', 'cpu'\], got 'cuda'"),
    ("rows", -1, r"choose_device.rows must be an integer >= 0, got -1"),
    ("features", 0, r"choose_device.features must be an integer >= 1, got 0"),
    ("iterations", 0, r"choose_device.iterations must be an integer >= 1, got 0"),
])
def test_choose_device_bad_argument_names_it(field, value, message):
    arguments = {"family": "xgboost", "rows": 10, "features": 2, "iterations": 5, "accelerator": "auto", field: value}
    with pytest.raises(SpecError, match=message):
        choose_device(GPU, **arguments)
