"""RayBatchScoreOperator: score a file of new rows with a trained model, as a Ray Data job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from operators.errors import RayOperatorError
from operators.hooks.ray import RayHook
from operators.ray_job import RayJobOperator
from operators.ray_serve import DEPLOYMENT_NAME

if TYPE_CHECKING:
    from airflow.sdk import Context


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


class RayBatchScoreOperator(RayJobOperator):
    """Write predictions for a CSV/Parquet file next to it, with Ray Data's batch-inference pattern.

    Runs the ``score`` stage (``python -m rayml.score``): a pool of actors that each load the
    model once scores the input in batches; the output is the input's rows plus a prediction
    column, in the input's format, at ``<input name>.predictions-<model version>`` (never over an
    earlier output). The XCom is the stage's manifest (``output_uri``, ``rows``, ``model_version``,
    a summary of the predictions).

    :param input_uri: the file (or directory of files) to score. (templated)
    :param model: which model: a RayTrain XCom, an asset event's extra (``model_dir``), or a model
        directory URI. None: the model the Serve application ``app_name`` serves now. (templated)
    :param app_name: the Serve application whose model is used when ``model`` is None.
    :param output_uri: where to write instead of next to the input (must not exist). (templated)
    :param prediction_column: the added column; default ``predicted_<label>``.
    :param batch_size: rows per batch; :param concurrency: scoring actors;
    :param cpus_per_actor: CPUs each actor reserves.
    """

    template_fields: Sequence[str] = (*RayJobOperator.template_fields, "input_uri", "model", "output_uri")
    template_fields_renderers = {**RayJobOperator.template_fields_renderers, "model": "json"}

    def __init__(
        self,
        *,
        input_uri: str,
        model: dict[str, Any] | str | None = None,
        app_name: str = "wine-quality",
        output_uri: str | None = None,
        prediction_column: str | None = None,
        batch_size: int = 4096,
        concurrency: int = 1,
        cpus_per_actor: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(stage="score", **kwargs)
        self.input_uri = input_uri
        self.model = model
        self.app_name = app_name
        self.output_uri = output_uri
        self.prediction_column = prediction_column
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.cpus_per_actor = cpus_per_actor

    def model_dir(self) -> str:
        model = self.model
        if isinstance(model, dict):
            uri = model.get("model_dir") or model.get("model_uri")
            if not uri:
                raise RayOperatorError(f"model must name a model directory ('model_dir'); got keys {sorted(model)}")
            return str(uri)
        if isinstance(model, str) and model.strip() and model.strip() != "None":
            return model.strip()
        return served_model(self.hook, self.app_name)["model_dir"]

    def build_spec(self, context: Context) -> dict[str, Any]:
        if not isinstance(self.input_uri, str) or not self.input_uri.strip():
            raise RayOperatorError(f"input_uri must name the file to score, got {self.input_uri!r}")
        spec = {"input_uri": self.input_uri.strip(), "model_dir": self.model_dir(),
                "output_uri": self.output_uri or None, "prediction_column": self.prediction_column,
                "batch_size": int(self.batch_size), "concurrency": int(self.concurrency),
                "cpus_per_actor": float(self.cpus_per_actor)}
        self.log.info("Scoring %s with the model in %s", spec["input_uri"], spec["model_dir"])
        return spec

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        manifest = super().finish(submission_id, artifact_dir, log_offset)
        self.log.info("Wrote %s prediction(s) of model %s to %s (%s)", manifest["rows"], manifest["model_version"],
                      manifest["output_uri"], manifest["predictions"])
        return manifest
