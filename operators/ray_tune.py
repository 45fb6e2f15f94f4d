"""RayTuneOperator: search model family x scaler x hyperparameters on Ray Tune, as a Ray job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ray_ml.stage import StageOperator
from airflow_ray_ml_stages.capacity import ResourceRequest
from airflow_ray_ml_stages.specs import TuneSpec, preprocessed_fields

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayTuneOperator(StageOperator):
    """Run a Ray Tune search (``airflow_ray_ml_stages.tune``) over the preprocessed splits and return its manifest.

    Each trial trains one sampled config (family ``lightning``, ``xgboost``, ``extra_trees`` or
    ``random_forest``, a scaler, the family's hyperparameters) in its own actor with the train stage's loops, on splits the
    preprocess stage already wrote (another scaler is an exact affine map of them: no refit), and
    reports its validation metrics; ASHA stops poor trials early. The test split is never read.
    The XCom holds ``best_config`` (pass it as is to ``RayTrainOperator(config=...)``),
    ``best_trial_id``, ``metric``, ``mode``, ``best_metric``, ``best_metrics``,
    ``best_checkpoint_uri``, ``leaderboard_json_uri``, ``leaderboard_csv_uri``, ``plot_uri``,
    ``trials`` (total, completed, failed, early_stopped), ``searcher``, ``scheduler``, ``time_s``.
    Each key is also an XCom of its own: ``RayTrainOperator(config=tune.output["best_config"])``.

    :param data: the preprocess task's XCom (``data=preprocess.output``): the train and validation
        splits, feature and label columns, the classes (classification), the preprocessor and its variants,
        the fingerprint. (templated)
    """

    spec_type: ClassVar[type] = TuneSpec
    derived_fields = tuple(preprocessed_fields(TuneSpec))
    own_template_fields = ("data",)
    template_fields_renderers = {
        **StageOperator.template_fields_renderers, "data": "json", "search_space": "json", "compute": "json",
    }
    ui_color = "#fff3e0"

    def __init__(self, *, data: dict[str, Any] | str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data = data

    def build_spec(self, context: Context) -> dict[str, Any]:
        return {**super().build_spec(context), **self.preprocessed(self.data)}

    def resource_requests(self, spec: dict[str, Any] | None) -> list[ResourceRequest]:
        """One trial of ``cpus_per_trial`` CPUs, where set (the stage sizes trials to the cluster otherwise)."""
        requests = super().resource_requests(spec)
        if (spec or {}).get("cpus_per_trial"):
            requests.append(ResourceRequest(what="trial", count=1, cpus=float(spec["cpus_per_trial"]),
                                            setting="cpus_per_trial"))
        return requests

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        from airflow_ray_ml_stages.ensemble import describe_members

        manifest = super().finish(submission_id, artifact_dir, log_offset)
        trials = manifest["trials"]
        best = manifest["best_config"]
        self.log.info(
            "Tuned: best %s %s=%.4f (trial %s); %d trials: %d completed, %d stopped early, %d failed in %.1f s "
            "(%s search, scheduler %s); leaderboard %s",
            f"ensemble of {describe_members(best['members'])}" if best.get("members")
            else f"{best.get('family')} ({best.get('scaler', 'as written')})", manifest["metric"],
            manifest["best_metric"], manifest["best_trial_id"], trials["total"],
            trials["completed"], trials["early_stopped"], trials["failed"], manifest["time_s"], manifest["searcher"],
            manifest["scheduler"], manifest["leaderboard_csv_uri"],
        )
        self.log.info("Trials: %s per trial, at most %d ran at once (%s)", manifest.get("resources_per_trial"),
                      manifest.get("most_trials_at_once", 0), manifest.get("trial_sizing", ""))
        return manifest
