"""RayTuneOperator: search model family x scaler x hyperparameters on Ray Tune, as a Ray job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from operators.errors import RayOperatorError
from operators.ray_job import RayJobOperator
from operators.ray_train import _structured

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayTuneOperator(RayJobOperator):
    """Run a Ray Tune search (``rayml.tune``) over the preprocessed splits and return its manifest.

    Each trial trains one sampled config (family ``lightning`` or ``xgboost``, a scaler, the
    family's hyperparameters) in its own actor with the train stage's loops, on splits the
    preprocess stage already wrote (another scaler is an exact affine map of them: no refit), and
    reports its validation metrics; ASHA stops poor trials early. The test split is never read.
    The XCom holds ``best_config`` (pass it as is to ``RayTrainOperator(config=...)``),
    ``best_trial_id``, ``metric``, ``mode``, ``best_metric``, ``best_metrics``,
    ``best_checkpoint_uri``, ``leaderboard_json_uri``, ``leaderboard_csv_uri``, ``plot_uri``,
    ``trials`` (total, completed, failed, early_stopped), ``searcher``, ``scheduler``, ``time_s``.

    :param preprocess: the preprocess task's manifest (``split_uris``, ``feature_columns``,
        ``label_column``, ``preprocessor_uri``, ``preprocessor_variants``, ``fingerprint``);
        None: the XCom of ``preprocess_task_id``. (templated)
    :param preprocess_task_id: the upstream RayDataPreprocessOperator task.
    :param search_space: the search space (see ``rayml.search_space``); None: the default for the
        wine data (both families, both scalers). (templated)
    :param metric: ``val_rmse`` (default), ``val_mae``, ``val_acc_0_5`` or ``val_acc_1_0``. (templated)
    :param searcher: ``random`` (default) or ``optuna`` (TPE). (templated)
    :param scheduler: ``asha`` (default) or ``none``. (templated)
    :param num_samples: trials to run. (templated)
    :param max_concurrent_trials: trials at once; None: as many as the resources fit. (templated)
    :param cpus_per_trial: CPUs per trial; None: the compute spec's ``cpus_per_worker``. (templated)
    :param compute: the GPU probe's compute spec; GPU specs give each trial its GPUs. (templated)
    :param time_budget_s: stop the search after this long; None: no limit. (templated)
    :param reports_per_trial: reports over a trial's budget (ASHA's rungs count them). (templated)
    :param asha_grace_period: reports before ASHA may stop a trial. (templated)
    :param asha_reduction_factor: ASHA keeps the best 1/N at each rung. (templated)
    :param seed: seeds the searcher and the trials (the train stage's default, 42). (templated)
    :param reuse_actors: run a new trial in a finished trial's actor (saves its start-up and
        imports); False: a new actor per trial.
    """

    template_fields: Sequence[str] = (
        *RayJobOperator.template_fields,
        "preprocess", "search_space", "metric", "searcher", "scheduler", "num_samples", "max_concurrent_trials",
        "cpus_per_trial", "compute", "time_budget_s", "reports_per_trial", "asha_grace_period",
        "asha_reduction_factor", "seed",
    )
    template_fields_renderers = {
        **RayJobOperator.template_fields_renderers, "preprocess": "json", "search_space": "json", "compute": "json",
    }
    ui_color = "#fff3e0"

    def __init__(
        self,
        *,
        preprocess: dict[str, Any] | str | None = None,
        preprocess_task_id: str | None = "preprocess",
        search_space: dict[str, Any] | str | None = None,
        metric: str = "val_rmse",
        searcher: str = "random",
        scheduler: str = "asha",
        num_samples: int = 16,
        max_concurrent_trials: int | None = None,
        cpus_per_trial: float | None = None,
        compute: dict[str, Any] | str | None = None,
        time_budget_s: float | None = None,
        reports_per_trial: int = 10,
        asha_grace_period: int = 1,
        asha_reduction_factor: int = 3,
        seed: int = 42,
        reuse_actors: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(stage="tune", **kwargs)
        self.preprocess = preprocess
        self.preprocess_task_id = preprocess_task_id
        self.search_space = search_space
        self.metric = metric
        self.searcher = searcher
        self.scheduler = scheduler
        self.num_samples = num_samples
        self.max_concurrent_trials = max_concurrent_trials
        self.cpus_per_trial = cpus_per_trial
        self.compute = compute
        self.time_budget_s = time_budget_s
        self.reports_per_trial = reports_per_trial
        self.asha_grace_period = asha_grace_period
        self.asha_reduction_factor = asha_reduction_factor
        self.seed = seed
        self.reuse_actors = reuse_actors

    def _preprocess_manifest(self, context: Context) -> dict[str, Any]:
        manifest = _structured("preprocess", self.preprocess)
        if not manifest:
            if not self.preprocess_task_id:
                raise RayOperatorError(f"task {self.task_id!r}: give preprocess, or preprocess_task_id")
            manifest = context["ti"].xcom_pull(task_ids=self.preprocess_task_id)
        splits = manifest.get("split_uris") if isinstance(manifest, dict) else None
        if not isinstance(splits, dict) or not splits.get("train") or not splits.get("validation"):
            raise RayOperatorError(
                f"task {self.task_id!r}: the preprocess manifest has no train and validation splits "
                f"(split_uris: {splits!r}); tuning needs both: give the preprocess stage a validation fraction > 0"
            )
        return manifest

    def build_spec(self, context: Context) -> dict[str, Any]:
        manifest = self._preprocess_manifest(context)
        optional = lambda value: None if value in (None, "", "None") else value  # noqa: E731
        spec: dict[str, Any] = {
            "train_uri": manifest["split_uris"]["train"],
            "validation_uri": manifest["split_uris"]["validation"],
            "feature_columns": list(manifest.get("feature_columns") or []),
            "label_column": manifest.get("label_column", "quality"),
            "preprocessor_uri": manifest.get("preprocessor_uri"),
            "preprocessor_variants": manifest.get("preprocessor_variants") or None,
            "data_fingerprint": manifest.get("fingerprint") or "",
            "search_space": _structured("search_space", optional(self.search_space)),
            "metric": self.metric, "searcher": self.searcher, "scheduler": self.scheduler,
            "num_samples": int(self.num_samples),
            "max_concurrent_trials": None if optional(self.max_concurrent_trials) is None else int(self.max_concurrent_trials),
            "cpus_per_trial": None if optional(self.cpus_per_trial) is None else float(self.cpus_per_trial),
            "time_budget_s": None if optional(self.time_budget_s) is None else float(self.time_budget_s),
            "reports_per_trial": int(self.reports_per_trial), "asha_grace_period": int(self.asha_grace_period),
            "asha_reduction_factor": int(self.asha_reduction_factor), "seed": int(self.seed),
            "reuse_actors": bool(self.reuse_actors),
        }
        compute = _structured("compute", self.compute)
        if compute:
            spec["compute"] = compute
        return spec

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        manifest = super().finish(submission_id, artifact_dir, log_offset)
        trials = manifest["trials"]
        self.log.info(
            "Tuned: best %s %s=%.4f (trial %s, %s); %d trials: %d completed, %d stopped early, %d failed in %.1f s "
            "(%s search, scheduler %s); leaderboard %s",
            manifest["best_config"].get("family"), manifest["metric"], manifest["best_metric"],
            manifest["best_trial_id"], manifest["best_config"].get("scaler", "as written"), trials["total"],
            trials["completed"], trials["early_stopped"], trials["failed"], manifest["time_s"], manifest["searcher"],
            manifest["scheduler"], manifest["leaderboard_csv_uri"],
        )
        return manifest
