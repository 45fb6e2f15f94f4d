"""Sizing rules of the probe and the compute spec contract."""

from __future__ import annotations

import pytest

from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.probe import NodeResources, cpu_headroom, plan_cpu, plan_gpu
from airflow_ray_ml_stages.specs import ComputeSpec


@pytest.mark.parametrize(("cpus", "headroom"), [(1, 0.5), (2, 1), (4, 1), (8, 2), (16, 4)])
def test_cpu_headroom_leaves_ray_data_room(cpus, headroom):
    assert cpu_headroom(cpus) == headroom


def test_plan_cpu_two_cpu_machine_one_worker_one_cpu():
    compute = plan_cpu([NodeResources("head", 2, 0)], max_workers=4, reason="r")
    assert (compute.num_workers, compute.cpus_per_worker, compute.use_gpu) == (1, 1.0, False)


def test_plan_cpu_single_cpu_node_gets_a_fraction():
    assert plan_cpu([NodeResources("head", 1, 0)], 4, "r").cpus_per_worker == 0.5


def test_plan_cpu_one_worker_per_node_sized_by_the_smallest():
    nodes = [NodeResources("a", 16, 0), NodeResources("b", 8, 0), NodeResources("c", 2, 0)]
    compute = plan_cpu(nodes, max_workers=2, reason="r")
    assert (compute.num_workers, compute.cpus_per_worker) == (2, 6.0)
    assert compute.cluster == {"nodes": 3, "cpus": 26, "gpus": 0, "accelerator_types": []}


def test_plan_gpu_one_worker_per_gpu_cpus_shared():
    nodes = [NodeResources("head", 8, 0), NodeResources("g1", 16, 4, "H200"), NodeResources("g2", 16, 4, "H200")]
    compute = plan_gpu(nodes, max_workers=6, reason="ok", devices=[{"name": "H200"}])
    assert compute.use_gpu and compute.accelerator == "gpu" and compute.gpus_per_worker == 1
    assert compute.num_workers == 6 and compute.cpus_per_worker == 3.0
    assert compute.cluster["accelerator_types"] == ["H200"]


def test_node_resources_reads_ray_resource_keys():
    node = NodeResources.from_resources("n", {"CPU": 8.0, "GPU": 1.0, "accelerator_type:A10G": 1.0})
    assert (node.cpus, node.gpus, node.accelerator_type) == (8.0, 1.0, "A10G")


def test_compute_spec_round_trip_and_summary():
    compute = plan_cpu([NodeResources("head", 2, 0)], 4, "no GPU", decided_in_s=0.05)
    again = ComputeSpec.from_json(compute.to_json())
    assert again == compute
    assert again.summary() == "CPU: 1 worker(s) x 1 CPU - no GPU (decided in 0.05 s)"


@pytest.mark.parametrize(
    "fields",
    [
        {"use_gpu": True, "gpus_per_worker": 0, "accelerator": "gpu"},
        {"use_gpu": False, "gpus_per_worker": 1, "accelerator": "cpu"},
        {"use_gpu": False, "gpus_per_worker": 0, "accelerator": "gpu"},
        {"use_gpu": "yes", "gpus_per_worker": 0, "accelerator": "cpu"},
    ],
)
def test_compute_spec_inconsistent_fields_rejected(fields):
    with pytest.raises(SpecError):
        ComputeSpec(num_workers=1, cpus_per_worker=1, reason="r", **fields)
