"""RayTrainOperator: train a Lightning MLP or an XGBoost booster on Ray Train, as a Ray job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ray_ml.contract import coerce_value
from airflow_ray_ml.stage import StageOperator
from airflow_ray_ml_stages.capacity import Capacity, ResourceRequest
from airflow_ray_ml_stages.specs import TrainSpec, preprocessed_fields
from airflow_ray_ml_stages.train.sizing import plan_training

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_ray_ml.job_status import Decision


class RayTrainOperator(StageOperator):
    """Train a model on Ray Train (``airflow_ray_ml_stages.train``) and return its manifest as the XCom.

    The job fits the chosen family on the preprocessed splits, checkpoints into this task run's
    artifact directory (a retry of the same task run resumes from the last checkpoint), and writes
    a model directory: the model (tensors-only ``model.pt`` or XGBoost's ``model.ubj``), the
    preprocessor JSON and ``model_card.json``. The XCom holds ``model_dir``, ``family``,
    ``metrics`` (validation and test: the task's metrics), ``baseline``, ``config``,
    ``model_version``, ``compute_used`` (the device and its reason, any GPU fallback) and
    ``training``; hand it to ``RayServeDeployOperator(model=train.output)``.

    Before it submits, the operator plans the run from the preprocess XCom's row counts and the
    probe's compute spec as the job will (``airflow_ray_ml_stages.train.sizing.plan_training``):
    a GPU run without Ray Train workers trains in the job's own process, so the job is submitted
    with ``entrypoint_num_gpus`` (unless that is given) and holds the GPU itself.

    :param data: the preprocess task's XCom (``data=preprocess.output``): the three splits, feature
        and label columns, the classes (classification), the preprocessor the splits were written with and its
        variants (for a
        config that names another scaler, as RayTune's best config may), the fingerprint. (templated)
    """

    spec_type: ClassVar[type] = TrainSpec
    derived_fields = tuple(preprocessed_fields(TrainSpec))
    own_template_fields = ("data",)
    template_fields_renderers = {**StageOperator.template_fields_renderers, "data": "json", "config": "json",
                                 "compute": "json"}
    ui_color = "#e8f5e9"

    def __init__(self, *, data: dict[str, Any] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = data

    def build_spec(self, context: Context) -> dict[str, Any]:
        return {**super().build_spec(context), **self.preprocessed(self.data)}

    def job_gpus(self, spec: dict[str, Any]) -> float:
        """GPUs the job's own process needs for ``spec``: the planned run's, from the data's row counts."""
        rows = self.preprocessed_rows()
        if rows is None:  # no row counts: the job trains on a Ray Train GPU worker if it needs a GPU
            return 0.0
        train_rows, other_rows = rows
        return plan_training(TrainSpec.from_dict(spec), train_rows, other_rows).job_gpus

    def preprocessed_rows(self) -> tuple[int, int] | None:
        """The training rows and the other splits' rows from the preprocess XCom, or None without them."""
        data = coerce_value(self.data, dict, f"{self.task_id}.data")
        rows = data.get("rows") if isinstance(data, dict) else None
        counts = [rows.get(split) if isinstance(rows, dict) else None for split in ("train", "validation", "test")]
        if not all(isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in counts):
            return None
        return counts[0], counts[1] + counts[2]

    def submit(self, context: Context, submission_id: str, spec: dict[str, Any] | None, artifact_dir: str) -> Decision:
        if spec is not None and self.entrypoint_num_gpus is None:
            gpus = self.job_gpus(spec)
            advertised = self.advertised_gpus() if gpus else 0.0
            if gpus and advertised >= gpus:
                self.log.info("The job trains in its own process on the GPU: submitting it with "
                              "entrypoint_num_gpus=%g", gpus)
                self.entrypoint_num_gpus = gpus
            elif gpus:
                # A job asking for a GPU the cluster lacks would wait for it forever; without one
                # it trains on a Ray Train GPU worker, whose placement falls back to CPU after
                # gpu_placement_timeout_s.
                self.log.warning("The compute spec plans a GPU but the cluster advertises %g: submitting the job "
                                 "without one", advertised)
        return super().submit(context, submission_id, spec, artifact_dir)

    def advertised_gpus(self) -> float:
        """GPUs the cluster's alive nodes advertise in total."""
        return Capacity.of_nodes(self.hook.get_nodes()).total_gpus

    def resource_requests(self, spec: dict[str, Any] | None) -> list[ResourceRequest]:
        """The Ray Train workers ``num_workers`` asks for (CPUs only: without its GPUs a worker trains on CPU)."""
        requests = super().resource_requests(spec)
        workers = (spec or {}).get("num_workers")
        if workers:
            cpus = float((spec.get("compute") or {}).get("cpus_per_worker") or 1)
            requests.append(ResourceRequest(what="training worker", count=int(workers), cpus=cpus,
                                            setting="num_workers (the train_workers Param)"))
        return requests

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        manifest = super().finish(submission_id, artifact_dir, log_offset)
        test, baseline = manifest["metrics"]["test"], manifest["baseline"]
        used = manifest["compute_used"]
        if manifest.get("classes") is None:
            self.log.info(
                "Trained %s model %s: test RMSE %.4f (mean-predictor baseline %.4f), MAE %.4f, within 0.5: %.1f%%, "
                "within 1.0: %.1f%%; model in %s",
                manifest["family"], manifest["model_version"], test["rmse"], baseline["test_rmse"], test["mae"],
                100 * test["acc_0_5"], 100 * test["acc_1_0"], manifest["model_dir"],
            )
        else:
            self.log.info(
                "Trained %s model %s for %d classes: test log loss %.4f (class-shares baseline %.4f), accuracy "
                "%.1f%% (baseline %.1f%%), macro F1 %.3f; model in %s",
                manifest["family"], manifest["model_version"], len(manifest["classes"]), test["log_loss"],
                baseline["test_log_loss"], 100 * test["accuracy"], 100 * baseline["test_accuracy"], test["macro_f1"],
                manifest["model_dir"],
            )
        self.log.info("Compute used: %s worker(s) on %s (%s); %s; device: %s", used["num_workers"], used["device"],
                      "local mode" if used["local_mode"] else "Ray Train workers", used["sizing_reason"],
                      used.get("device_reason"))
        if used.get("gpu_fallback"):
            self.log.warning("GPU fallback: %s", used["fallback_reason"])
        return manifest
