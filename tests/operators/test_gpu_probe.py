"""GPUProbeOperator against real local Ray clusters: CPU-only, and one advertising an unusable GPU."""

from __future__ import annotations

import time

import pytest

from airflow_ray_ml.errors import GPUNotAvailableError
from airflow_ray_ml.gpu_probe import GPUProbeOperator, branch_on_compute
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml_stages.specs import ComputeSpec
from tests.conftest import extra_cluster, requires_cuda
from tests.operators.test_ray_job import _run, _xcom


def _states(dag_run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def _nothing_left_pending(hook: RayHook) -> None:
    tasks = hook.get_json("/api/v0/tasks", params={"limit": "10000", "detail": "1"})["data"]["result"]["result"]
    unfinished = [t for t in tasks if t["func_or_class_name"] == "cuda_smoke_test" and t["state"] not in ("FINISHED", "FAILED")]
    assert unfinished == []
    groups = hook.get_json("/api/v0/placement_groups", params={"limit": "1000"})["data"]["result"]["result"]
    assert [g for g in groups if g.get("state") != "REMOVED"] == []


def test_branch_on_compute_follows_the_decision():
    cpu = ComputeSpec.cpu("no GPU").to_dict()
    gpu = ComputeSpec(use_gpu=True, gpus_per_worker=1, num_workers=1, cpus_per_worker=1, accelerator="gpu",
                      reason="ok").to_dict()
    assert branch_on_compute(cpu, gpu="g", cpu="c") == "c"
    assert branch_on_compute(gpu, gpu=["g1", "g2"], cpu="c") == ["g1", "g2"]


def test_require_gpu_on_cpu_decision_fails_with_the_fix():
    operator = GPUProbeOperator(task_id="probe", require_gpu=True)
    with pytest.raises(GPUNotAvailableError, match="require_gpu=True.*no GPU here.*require_gpu=False"):
        operator._conclude(ComputeSpec.cpu("no GPU here"))


@pytest.fixture(scope="module")
def cpu_branch_run(airflow_db, ray_conn):
    """One run of the branching DAG on the session's CPU-only cluster: its probe, then the branch."""
    return _run("probe_branch")


@pytest.mark.integration
def test_probe_cpu_only_cluster_decides_cpu_fast_and_leaves_nothing(cpu_branch_run):
    assert cpu_branch_run.state == "success"
    compute = ComputeSpec.from_dict(_xcom(cpu_branch_run, "probe"))
    assert compute.use_gpu is False and compute.accelerator == "cpu" and compute.gpus_per_worker == 0
    assert "advertises no GPU" in compute.reason and "2 CPUs" in compute.reason
    assert compute.decided_in_s < 2.0
    # 2 CPUs: one training worker with one CPU, one CPU left for Ray Data
    assert (compute.num_workers, compute.cpus_per_worker) == (1, 1.0)
    _nothing_left_pending(RayHook())


@pytest.mark.integration
def test_probe_wait_for_gpu_withdraws_its_request(airflow_db, ray_conn):
    dag_run = _run("probe_cpu_wait")
    assert dag_run.state == "success"
    compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
    assert compute.use_gpu is False and "after waiting 2 s" in compute.reason
    hook = RayHook()
    deadline = time.monotonic() + 45
    while True:  # the autoscaler monitor reports the cleared request on its next cycle
        demand = hook.get_json("/api/cluster_status", params={"format": "0"})["data"]["clusterStatus"]
        if demand["loadMetricsReport"]["requestDemand"] == []:
            break
        assert time.monotonic() < deadline, f"resource request still pending: {demand['loadMetricsReport']}"
        time.sleep(1)
    _nothing_left_pending(hook)


@pytest.mark.integration
def test_probe_branch_dag_takes_the_cpu_branch(cpu_branch_run):
    states = _states(cpu_branch_run)
    assert states["train_on_cpu"] == "success" and states["train_on_gpu"] == "skipped"


@pytest.mark.integration
def test_probe_advertised_unusable_gpu_falls_back_to_cpu(fake_gpu_cluster):
    dag_run = _run("probe_fake_gpu")
    assert dag_run.state == "success"
    compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
    assert compute.use_gpu is False and compute.accelerator == "cpu"
    assert "advertised by Ray but not usable by CUDA" in compute.reason
    assert compute.cluster["gpus"] == 1
    assert compute.devices and compute.devices[0]["usable"] is False
    _nothing_left_pending(RayHook("ray_fake_gpu"))


@pytest.mark.integration
def test_probe_advertised_unusable_gpu_with_require_gpu_fails(fake_gpu_cluster):
    dag_run = _run("probe_fake_gpu_required")
    assert dag_run.state == "failed"
    assert _states(dag_run)["probe"] == "failed"


@pytest.mark.gpu
@pytest.mark.integration
@requires_cuda
def test_probe_real_gpu_decides_gpu_with_the_device_name(airflow_db):
    import torch

    with extra_cluster("ray_fake_gpu", num_cpus=4, num_gpus=None):  # the GPUs Ray finds
        dag_run = _run("probe_fake_gpu")  # same DAG, pointed at a cluster whose GPU is real
        compute = ComputeSpec.from_dict(_xcom(dag_run, "probe"))
        assert compute.use_gpu is True and compute.accelerator == "gpu", compute.reason
        assert compute.devices[0]["name"] == torch.cuda.get_device_name(0)
        assert compute.devices[0]["usable"] is True and compute.devices[0]["memory_gib"] > 0
