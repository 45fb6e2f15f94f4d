"""GPUProbeOperator: decide GPU or CPU once per run, in seconds, and say why."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ray_ml.contract import operator_setting
from airflow_ray_ml.errors import GPUNotAvailableError
from airflow_ray_ml.links.ray import RAY_JOB_XCOM_KEY, cluster_page_url
from airflow_ray_ml.stage import StageOperator
from airflow_ray_ml_stages.probe import NodeResources, plan_cpu
from airflow_ray_ml_stages.specs import ComputeSpec, ProbeSpec

if TYPE_CHECKING:
    from airflow.sdk import Context


def branch_on_compute(compute: dict[str, Any], *, gpu: str | list[str], cpu: str | list[str]) -> str | list[str]:
    """Pick the task id(s) to follow from a probe's XCom; for ``@task.branch``::

        @task.branch
        def choose(compute=probe.output):
            return branch_on_compute(compute, gpu="train_on_gpu", cpu="train_on_cpu")
    """
    return gpu if ComputeSpec.from_dict(compute).use_gpu else cpu


class GPUProbeOperator(StageOperator):
    """Decide whether this run trains and serves on GPU or CPU, and size the workers.

    Where the cluster advertises no GPU (and ``wait_for_gpu_s`` is 0) the decision comes from the
    State API alone, in well under a second. Where GPUs are advertised, a Ray job places one
    ``num_gpus=1`` task and runs a CUDA smoke test in it; a GPU that Ray advertises but CUDA cannot
    use means CPU, with that reason. The XCom is the compute spec (``airflow_ray_ml_stages.specs.ComputeSpec``)
    that RayTrain, RayTune and RayServeDeploy take.

    :param require_gpu: fail the task instead of falling back to CPU. (templated)
    """

    spec_type: ClassVar[type] = ProbeSpec
    own_template_fields = ("require_gpu",)
    ui_color = "#fff4d6"

    def __init__(self, *, require_gpu: bool | str = False, **kwargs: Any) -> None:
        kwargs.setdefault("poll_interval_s", 0.5)
        super().__init__(**kwargs)
        self.require_gpu = require_gpu

    def execute(self, context: Context) -> dict[str, Any]:
        started = time.monotonic()
        spec = self.full_spec(context)  # validate the arguments before touching the cluster
        self.require_gpu = operator_setting(self.require_gpu, bool, f"{self.task_id}.require_gpu")
        nodes = [
            NodeResources.from_resources(node_id, node["total"])
            for node_id, node in self.hook.get_cluster_resources().items()
            if node.get("state") == "ALIVE"
        ]
        if not any(node.gpus >= 1 for node in nodes) and not spec["wait_for_gpu_s"]:
            total_cpus = sum(node.cpus for node in nodes)
            compute = plan_cpu(
                nodes, spec["max_workers"],
                f"the Ray cluster advertises no GPU ({len(nodes)} node(s), {total_cpus:g} CPUs)",
                decided_in_s=round(time.monotonic() - started, 3),
            )
            # No job ran: the task's "Ray job" link shows the cluster page the decision came from.
            context["ti"].xcom_push(key=RAY_JOB_XCOM_KEY, value={
                "dashboard_url": self.hook.dashboard_url, "submission_id": None,
                "job_url": cluster_page_url(self.hook.dashboard_url),
            })
            return self._conclude(compute)
        return self._conclude_manifest(super().execute(context))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._conclude_manifest(super().execute_complete(context, event, **kwargs))

    def _conclude_manifest(self, manifest: dict[str, Any]) -> dict[str, Any]:
        fields = ComputeSpec.__dataclass_fields__
        return self._conclude(ComputeSpec.from_dict({key: manifest[key] for key in fields if key in manifest}))

    def _conclude(self, compute: ComputeSpec) -> dict[str, Any]:
        self.log.info("Compute decision: %s", compute.summary())
        if self.require_gpu and not compute.use_gpu:
            raise GPUNotAvailableError(
                f"require_gpu=True but no usable GPU was found: {compute.reason}. Add a GPU node with a "
                "working CUDA driver, raise wait_for_gpu_s on an autoscaling cluster, or set "
                "require_gpu=False to fall back to CPU."
            )
        return compute.to_dict()
