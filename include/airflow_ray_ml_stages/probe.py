"""Stage ``probe``: decide GPU or CPU once, with a real CUDA check and a clean fallback.

Ray advertising a GPU is not proof that CUDA can use it (a node started with ``--num-gpus`` on a
machine without a driver, a broken driver, a CPU build of torch). So where GPUs are advertised the
probe places one ``num_gpus=1`` task and runs a CUDA smoke test in it: ``torch.cuda.is_available()``,
the device's name and memory, and a matrix product checked against the CPU result. The task is a
``max_calls=1`` task, so its process exits and frees the GPU memory before any stage needs it.

Anything the probe asks for is taken back before it returns: a pending smoke test is cancelled,
and an autoscaler resource request (``wait_for_gpu_s``) is cleared.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

from airflow_ray_ml_stages.specs import ComputeSpec, ProbeSpec
from airflow_ray_ml_stages.stage import main_of, run_stage

log = logging.getLogger("airflow_ray_ml_stages.probe")

ACCELERATOR_PREFIX = "accelerator_type:"


@dataclass(frozen=True)
class NodeResources:
    """One alive Ray node's advertised resources."""

    node_id: str
    cpus: float
    gpus: float
    accelerator_type: str | None = None

    @classmethod
    def from_resources(cls, node_id: str, resources: dict[str, float]) -> "NodeResources":
        types = [key[len(ACCELERATOR_PREFIX):] for key in resources if key.startswith(ACCELERATOR_PREFIX)]
        return cls(node_id, float(resources.get("CPU", 0)), float(resources.get("GPU", 0)),
                   types[0] if types else None)


def cpu_headroom(cpus: float) -> float:
    """CPUs to leave free on a node for Ray Data (a quarter, at least one; half of a single CPU)."""
    return max(1.0, math.floor(cpus / 4)) if cpus >= 2 else cpus / 2


def _worker_cpus(node: NodeResources, workers_on_node: float) -> float:
    usable = node.cpus - cpu_headroom(node.cpus)
    return max(0.5, math.floor(usable / workers_on_node * 2) / 2)  # whole or half CPUs


def cluster_summary(nodes: Iterable[NodeResources]) -> dict[str, Any]:
    nodes = list(nodes)
    return {
        "nodes": len(nodes),
        "cpus": sum(node.cpus for node in nodes),
        "gpus": sum(node.gpus for node in nodes),
        "accelerator_types": sorted({node.accelerator_type for node in nodes if node.accelerator_type}),
    }


def plan_cpu(nodes: list[NodeResources], max_workers: int, reason: str, **fields: Any) -> ComputeSpec:
    """CPU plan: one worker per node (largest first, up to ``max_workers``) leaving CPU headroom."""
    candidates = sorted((node for node in nodes if node.cpus > 0), key=lambda node: -node.cpus)
    chosen = candidates[: max(1, max_workers)] or [NodeResources("none", 1.0, 0.0)]
    cpus = min(_worker_cpus(node, 1) for node in chosen)
    return ComputeSpec.cpu(reason, num_workers=len(chosen), cpus_per_worker=cpus,
                           cluster=cluster_summary(nodes), **fields)


def plan_gpu(nodes: list[NodeResources], max_workers: int, reason: str, devices: list[dict],
             **fields: Any) -> ComputeSpec:
    """GPU plan: one worker per advertised GPU (up to ``max_workers``), CPUs shared per node."""
    gpu_nodes = [node for node in nodes if node.gpus >= 1]
    total_gpus = int(sum(math.floor(node.gpus) for node in gpu_nodes))
    cpus = min(_worker_cpus(node, math.floor(node.gpus)) for node in gpu_nodes)
    return ComputeSpec(use_gpu=True, gpus_per_worker=1, num_workers=max(1, min(max_workers, total_gpus)),
                       cpus_per_worker=cpus, accelerator="gpu", reason=reason, devices=devices,
                       cluster=cluster_summary(nodes), **fields)


def cuda_smoke_test(size: int = 512) -> dict[str, Any]:
    """Check the GPU this process was given: CUDA available, its name and memory, a correct matmul."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.cuda.is_available():
        return {"ok": False, "error": (
            f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES={visible!r})"
        )}
    try:
        properties = torch.cuda.get_device_properties(0)
        generator = torch.Generator().manual_seed(0)
        left = torch.randn(size, size, generator=generator)
        right = torch.randn(size, size, generator=generator)
        expected = left @ right
        device = torch.device("cuda", 0)
        got = (left.to(device) @ right.to(device)).cpu()
        error = float((got - expected).abs().max())
        ok = bool(torch.allclose(got, expected, rtol=1e-3, atol=1e-2))
    except Exception as err:  # a driver or memory fault is an answer, not a crash
        return {"ok": False, "error": f"CUDA smoke test raised {type(err).__name__}: {err}"}
    return {
        "ok": ok,
        "error": "" if ok else f"GPU matmul differs from the CPU result by {error:.3g}",
        "name": properties.name,
        "memory_gib": round(properties.total_memory / 2**30, 1),
        "max_abs_error": error,
        "cuda_visible_devices": visible,
    }


def _alive_nodes() -> list[NodeResources]:
    import ray

    return [
        NodeResources.from_resources(node["NodeID"], node.get("Resources", {}))
        for node in ray.nodes()
        if node.get("Alive")
    ]


def _wait_for_advertised_gpu(wait_s: float) -> list[NodeResources]:
    """Ask the autoscaler for one GPU and wait up to ``wait_s`` for a node that has it."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{"GPU": 1}])
    try:
        deadline = time.monotonic() + wait_s
        while True:
            nodes = _alive_nodes()
            if any(node.gpus >= 1 for node in nodes) or time.monotonic() >= deadline:
                return nodes
            time.sleep(0.5)
    finally:
        request_resources(bundles=[])  # withdraw the request, whatever happened


def run_probe(spec: ProbeSpec) -> ComputeSpec:
    """Decide GPU or CPU for this run and size the workers."""
    import ray

    started = time.monotonic()
    ray.init(address="auto", logging_level=logging.WARNING, log_to_driver=False)
    try:
        nodes = _alive_nodes()
        waited = ""
        if not any(node.gpus >= 1 for node in nodes) and spec.wait_for_gpu_s > 0:
            log.info("no GPU advertised; asking the autoscaler for one and waiting up to %s s", spec.wait_for_gpu_s)
            nodes = _wait_for_advertised_gpu(spec.wait_for_gpu_s)
            waited = f" after waiting {spec.wait_for_gpu_s:g} s for one"
        summary = cluster_summary(nodes)
        if not any(node.gpus >= 1 for node in nodes):
            return plan_cpu(nodes, spec.max_workers,
                            f"the Ray cluster advertises no GPU{waited} ({summary['nodes']} node(s), "
                            f"{summary['cpus']:g} CPUs)", decided_in_s=round(time.monotonic() - started, 3))

        smoke = ray.remote(num_gpus=1, num_cpus=0, max_calls=1, max_retries=0)(cuda_smoke_test)
        reference = smoke.remote()
        ready, _ = ray.wait([reference], timeout=spec.smoke_timeout_s)
        if not ready:
            ray.cancel(reference, force=True)
            return plan_cpu(nodes, spec.max_workers,
                            f"{summary['gpus']:g} GPU(s) advertised but none could be placed within "
                            f"{spec.smoke_timeout_s:g} s (busy or unschedulable)",
                            decided_in_s=round(time.monotonic() - started, 3))
        try:
            result = ray.get(reference)
        except Exception as err:
            result = {"ok": False, "error": f"the smoke test task failed: {type(err).__name__}: {err}"}
        decided_in_s = round(time.monotonic() - started, 3)
        if not result.get("ok"):
            return plan_cpu(
                nodes, spec.max_workers,
                f"GPU advertised by Ray but not usable by CUDA: {result.get('error')}",
                devices=[{**result, "usable": False}], decided_in_s=decided_in_s,
            )
        device = {key: result[key] for key in ("name", "memory_gib", "max_abs_error")}
        return plan_gpu(nodes, spec.max_workers,
                        f"CUDA smoke test passed on {result['name']} ({result['memory_gib']} GiB)",
                        devices=[{**device, "usable": True}], decided_in_s=decided_in_s)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    return run_stage(ProbeSpec, run_probe, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
