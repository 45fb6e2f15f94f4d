"""RayBatchScoreOperator: score a file of new rows with a trained model, as a Ray job (Ray Data for a large input)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow_ray_ml.contract import coerce_value
from airflow_ray_ml.errors import InvalidSpecError, RayOperatorError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_apps import DEPLOYMENT_NAME
from airflow_ray_ml.stage import StageOperator
from airflow_ray_ml_stages.specs import ScoreSpec

if TYPE_CHECKING:
    from airflow.sdk import Asset, Context

DRIFT_ALIAS_PREFIX = "airflow-ray-ml-drift:"
"""The AssetAlias a scoring task emits its drift event through is this plus the drift Asset's name."""


def served_model(hook: RayHook, app_name: str) -> dict[str, Any]:
    """The live ``user_config`` (``model_dir``, ``model_version``) of the Serve application ``app_name``."""
    apps = (hook.get_serve_applications().get("applications") or {})
    config = (apps.get(app_name) or {}).get("deployed_app_config") or {}
    for deployment in config.get("deployments") or []:
        if deployment.get("name") == DEPLOYMENT_NAME and (deployment.get("user_config") or {}).get("model_dir"):
            return dict(deployment["user_config"])
    raise RayOperatorError(
        f"no model given and Ray Serve serves no application {app_name!r} (it has {sorted(apps)}); "
        "pass model=<model_dir or a RayTrain XCom> or deploy a model first"
    )


def drift_extras(extras: Any) -> list[dict[str, Any]]:
    """The extras among asset events' ``extras`` that :meth:`RayBatchScoreOperator.announce_drift`
    emitted (a ``reason`` and the ``drift`` report); other events' extras are left out."""
    return [extra for extra in extras if isinstance(extra, dict) and extra.get("reason") and "drift" in extra]


class RayBatchScoreOperator(StageOperator):
    """Write predictions for a CSV/Parquet file next to it, with Ray Data's batch-inference pattern.

    Runs the ``score`` stage (``python -m airflow_ray_ml_stages.score``): a pool of actors that each load the
    model once scores the input in batches (an input of at most ``direct_max_bytes`` is scored so in
    the job's driver, without Ray Data's start-up: ``engine``); the output is the input's rows plus a prediction
    column, in the input's format, at ``<input name>.predictions-<model version>`` (never over an
    earlier output). The XCom is the stage's manifest (``output_uri``, ``rows``, ``model_version``,
    a summary of the predictions).

    :param model: which model: a RayTrain XCom (``model=train.output``), an asset event's extra
        (``model_dir``), or a model directory URI. None: the model the Serve application
        ``app_name`` serves now. (templated)
    :param app_name: the Serve application whose model is used when ``model`` is None; then it is
        required. Scoring runs in a DAG of its own, so it is not derived from the DAG as the
        deploy's is. (templated)
    :param drift_asset: an Asset (or its name) that gets an event when the file has drifted from
        the model's training data (the drift report's verdict is ``drift``), with the report in the
        event's extra; a DAG scheduled on it retrains. None: no event. The task emits it through an
        AssetAlias outlet of its own, so a stable file emits nothing.
    """

    spec_type: ClassVar[type] = ScoreSpec
    derived_fields = ("model_dir",)
    own_template_fields = ("model", "app_name")
    template_fields_renderers = {**StageOperator.template_fields_renderers, "model": "json"}

    def __init__(self, *, model: dict[str, Any] | str | None = None, app_name: str | None = None,
                 drift_asset: Asset | str | None = None, **kwargs: Any) -> None:
        from airflow.sdk import Asset, AssetAlias

        self.drift_asset = Asset(drift_asset) if isinstance(drift_asset, str) else drift_asset
        self.drift_alias = None
        if self.drift_asset is not None:
            self.drift_alias = AssetAlias(f"{DRIFT_ALIAS_PREFIX}{self.drift_asset.name}")
            outlets = kwargs.get("outlets") or []
            kwargs["outlets"] = [*(outlets if isinstance(outlets, list) else [outlets]), self.drift_alias]
        super().__init__(**kwargs)
        self.model = model
        self.app_name = app_name

    def execute(self, context: Context) -> dict[str, Any]:
        return self.announce_drift(context, super().execute(context))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return self.announce_drift(context, super().execute_complete(context, event, **kwargs))

    def announce_drift(self, context: Context, manifest: dict[str, Any]) -> dict[str, Any]:
        """Log the file's drift verdict; where it is ``drift`` and ``drift_asset`` is set, emit the
        asset event (the report in its extra), which starts the DAGs scheduled on it."""
        drift = manifest.get("drift") or {}
        if not drift:
            return manifest
        if drift.get("verdict") != "drift":
            self.log.info("Drift: %s against the training data of %s (report %s)", drift.get("verdict"),
                          manifest["model_version"], drift.get("report_uri"))
            return manifest
        self.log.warning("Drift: %s in %s against the training data of %s (report %s)", drift.get("reason"),
                         manifest["input_uri"], manifest["model_version"], drift.get("report_uri"))
        if self.drift_asset is not None:
            ti = context["ti"]
            extra = {"reason": drift["reason"], "model_version": manifest["model_version"],
                     "model_dir": manifest["model_dir"], "input_uri": manifest["input_uri"],
                     "output_uri": manifest["output_uri"], "dag_id": ti.dag_id, "run_id": ti.run_id,
                     "drift": drift}
            context["outlet_events"][self.drift_alias].add(self.drift_asset, extra=extra)
            self.log.info("Asset event on %r: %s", self.drift_asset.name, drift["reason"])
        return manifest

    def model_dir(self) -> str:
        model = coerce_value(self.model, dict[str, Any] | str | None, f"{self.task_id}.model")
        if isinstance(model, dict):
            uri = model.get("model_dir") or model.get("model_uri")
            if not uri:
                raise RayOperatorError(f"model must name a model directory ('model_dir'); got keys {sorted(model)}")
            return str(uri)
        if isinstance(model, str) and model.strip():
            return model.strip()
        app_name = coerce_value(self.app_name, str | None, f"{self.task_id}.app_name")
        if not isinstance(app_name, str) or not app_name.strip():
            raise InvalidSpecError(
                f"task {self.task_id!r} has no model to score with: pass model= (a RayTrain XCom, an asset event's "
                "extra or a model directory URI), or app_name= naming the Serve application whose model to use; "
                f"got model={self.model!r:.200}, app_name={self.app_name!r}"
            )
        return served_model(self.hook, app_name.strip())["model_dir"]

    def build_spec(self, context: Context) -> dict[str, Any]:
        if not isinstance(self.input_uri, str) or not self.input_uri.strip():
            raise InvalidSpecError(f"input_uri must name the file to score, got {self.input_uri!r}")
        spec = {**super().build_spec(context), "input_uri": self.input_uri.strip(), "model_dir": self.model_dir()}
        self.log.info("Scoring %s with the model in %s", spec["input_uri"], spec["model_dir"])
        return spec

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        manifest = super().finish(submission_id, artifact_dir, log_offset)
        self.log.info("Wrote %s prediction(s) of model %s to %s (%s)", manifest["rows"], manifest["model_version"],
                      manifest["output_uri"], manifest["predictions"])
        return manifest
