"""RayTrainOperator: train a Lightning MLP or an XGBoost booster on Ray Train, as a Ray job."""

from __future__ import annotations

import ast
import json
from typing import TYPE_CHECKING, Any, Sequence

from operators.errors import RayOperatorError
from operators.ray_job import RayJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


def _structured(name: str, value: Any) -> Any:
    """A dict/list argument that arrived as text (a template rendered without native types)."""
    if not isinstance(value, str):
        return value
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(value)
        except (ValueError, SyntaxError):
            continue
    raise RayOperatorError(
        f"{name} must be a dict or list, got the text {value[:200]!r}; pass the value itself or render "
        "templates as native objects (DAG(render_template_as_native_obj=True))"
    )


def preprocessed_inputs(task_id: str = "preprocess") -> dict[str, str]:
    """RayTrainOperator's data arguments as templates on a RayDataPreprocessOperator task's XCom.

    ``RayTrainOperator(task_id="train", config=..., **preprocessed_inputs("preprocess"))`` in a DAG
    with ``render_template_as_native_obj=True``: the splits, feature and label columns, the
    preprocessor (and its variants, for a config that names another scaler) and the fingerprint.
    """
    xcom = f"ti.xcom_pull({task_id!r})"
    fields = {
        "train_uri": "['split_uris']['train']", "validation_uri": "['split_uris']['validation']",
        "test_uri": "['split_uris']['test']", "feature_columns": "['feature_columns']",
        "label_column": "['label_column']", "preprocessor_uri": "['preprocessor_uri']",
        "preprocessor_variants": ".get('preprocessor_variants')", "data_fingerprint": "['fingerprint']",
    }
    return {name: "{{ %s%s }}" % (xcom, path) for name, path in fields.items()}


class RayTrainOperator(RayJobOperator):
    """Train a model on Ray Train (``rayml.train``) and return its manifest as the XCom.

    The job fits the chosen family on the preprocessed splits, checkpoints into this task run's
    artifact directory (a retry of the same task run resumes from the last checkpoint), and writes
    a model directory: the model (tensors-only ``model.pt`` or XGBoost's ``model.ubj``), the
    preprocessor JSON and ``model_card.json``. The XCom holds ``model_dir``, ``family``,
    ``metrics`` (validation and test: rmse, mae, acc_0_5, acc_1_0), ``baseline``, ``config``,
    ``model_version``, ``compute_used`` (with any GPU fallback) and ``training``.

    :param train_uri: Parquet file or directory of the preprocessed training split. (templated)
    :param validation_uri: the validation split (early stopping, validation metrics). (templated)
    :param test_uri: the held-out test split (the model card's test metrics). (templated)
    :param feature_columns: the feature columns, in the order the model takes them. (templated)
    :param label_column: the regression target. (templated)
    :param preprocessor_uri: the preprocessor the splits were written with (the preprocess
        manifest's), copied into the model directory. (templated)
    :param preprocessor_variants: the preprocess manifest's ``preprocessor_variants``; needed when
        ``config`` names a ``scaler`` other than the one the splits were written with (RayTune's
        best config does): the features are mapped to it exactly and that variant is copied into
        the model directory instead. (templated)
    :param data_fingerprint: the data's fingerprint, recorded in the model card. (templated)
    :param family: ``lightning`` or ``xgboost``; overrides ``config["family"]``. (templated)
    :param config: hyperparameters, e.g. RayTune's best config as is; missing ones take the
        family's defaults (``rayml.specs.LIGHTNING_DEFAULTS`` / ``XGBOOST_DEFAULTS``). (templated)
    :param compute: the GPU probe's compute spec, e.g. ``"{{ ti.xcom_pull('probe') }}"`` in a DAG
        with ``render_template_as_native_obj=True``; default: one CPU worker. (templated)
    :param num_workers: Ray Train workers; 0 is Train's local mode; None sizes from the data. (templated)
    :param scale_out_min_rows: training rows from which the compute spec's workers are used. (templated)
    :param direct_max_bytes: largest in-memory size of the splits that a one-worker CPU plan
        trains in the job's process (see ``rayml.specs.TrainSpec``). (templated)
    :param gpu_placement_timeout_s: wait this long for the GPU workers' placement, then train on
        CPU and record the fallback. (templated)
    :param max_failures: worker failures recovered from the last checkpoint. (templated)
    :param checkpoint_every: checkpoint every N epochs or rounds; 0 picks one. (templated)
    :param data_loading: ``auto``, ``ray_data`` or ``direct`` (see ``rayml.specs.TrainSpec``). (templated)
    :param seed: the random seed; the same seed gives the same metrics on CPU. (templated)
    :param placement_strategy: ``PACK`` (default), ``SPREAD`` or ``STRICT_SPREAD`` (one worker per
        node) for the Ray Train workers. (templated)
    """

    template_fields: Sequence[str] = (
        *RayJobOperator.template_fields,
        "train_uri", "validation_uri", "test_uri", "feature_columns", "label_column", "preprocessor_uri",
        "preprocessor_variants", "data_fingerprint", "family", "config", "compute", "num_workers", "scale_out_min_rows",
        "direct_max_bytes", "gpu_placement_timeout_s", "max_failures", "checkpoint_every", "data_loading", "seed",
        "placement_strategy",
    )
    template_fields_renderers = {**RayJobOperator.template_fields_renderers, "config": "json", "compute": "json"}
    ui_color = "#e8f5e9"

    def __init__(
        self,
        *,
        train_uri: str,
        validation_uri: str,
        test_uri: str,
        feature_columns: list[str] | str,
        label_column: str = "quality",
        preprocessor_uri: str | None = None,
        preprocessor_variants: dict[str, str] | str | None = None,
        data_fingerprint: str = "",
        family: str | None = None,
        config: dict[str, Any] | str | None = None,
        compute: dict[str, Any] | str | None = None,
        num_workers: int | None = None,
        scale_out_min_rows: int = 200_000,
        direct_max_bytes: int = 2 * 1024**3,
        gpu_placement_timeout_s: float = 60.0,
        max_failures: int = 2,
        checkpoint_every: int = 0,
        data_loading: str = "auto",
        seed: int = 42,
        placement_strategy: str = "PACK",
        **kwargs: Any,
    ) -> None:
        super().__init__(stage="train", **kwargs)
        self.train_uri = train_uri
        self.validation_uri = validation_uri
        self.test_uri = test_uri
        self.feature_columns = feature_columns
        self.label_column = label_column
        self.preprocessor_uri = preprocessor_uri
        self.preprocessor_variants = preprocessor_variants
        self.data_fingerprint = data_fingerprint
        self.family = family
        self.config = config
        self.compute = compute
        self.num_workers = num_workers
        self.scale_out_min_rows = scale_out_min_rows
        self.direct_max_bytes = direct_max_bytes
        self.gpu_placement_timeout_s = gpu_placement_timeout_s
        self.max_failures = max_failures
        self.checkpoint_every = checkpoint_every
        self.data_loading = data_loading
        self.seed = seed
        self.placement_strategy = placement_strategy

    def build_spec(self, context: Context) -> dict[str, Any]:
        config = dict(_structured("config", self.config) or {})
        if self.family:
            config["family"] = self.family
        config.setdefault("family", "lightning")
        spec: dict[str, Any] = {
            "train_uri": self.train_uri, "validation_uri": self.validation_uri, "test_uri": self.test_uri,
            "feature_columns": _structured("feature_columns", self.feature_columns),
            "label_column": self.label_column, "preprocessor_uri": self.preprocessor_uri or None,
            "preprocessor_variants": _structured("preprocessor_variants", self.preprocessor_variants or None) or None,
            "data_fingerprint": self.data_fingerprint or "", "config": config,
            "num_workers": None if self.num_workers in (None, "", "None") else int(self.num_workers),
            "scale_out_min_rows": int(self.scale_out_min_rows), "direct_max_bytes": int(self.direct_max_bytes),
            "gpu_placement_timeout_s": float(self.gpu_placement_timeout_s),
            "max_failures": int(self.max_failures), "checkpoint_every": int(self.checkpoint_every),
            "data_loading": self.data_loading, "seed": int(self.seed),
            "placement_strategy": self.placement_strategy,
        }
        compute = _structured("compute", self.compute)
        if compute:
            spec["compute"] = compute
        return spec

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> dict[str, Any]:
        manifest = super().finish(submission_id, artifact_dir, log_offset)
        test, baseline = manifest["metrics"]["test"], manifest["baseline"]
        used = manifest["compute_used"]
        self.log.info(
            "Trained %s model %s: test RMSE %.4f (mean-predictor baseline %.4f), MAE %.4f, within 0.5: %.1f%%, "
            "within 1.0: %.1f%%; model in %s",
            manifest["family"], manifest["model_version"], test["rmse"], baseline["test_rmse"], test["mae"],
            100 * test["acc_0_5"], 100 * test["acc_1_0"], manifest["model_dir"],
        )
        self.log.info("Compute used: %s worker(s) on %s (%s); %s", used["num_workers"], used["device"],
                      "local mode" if used["local_mode"] else "Ray Train workers", used["sizing_reason"])
        if used.get("gpu_fallback"):
            self.log.warning("GPU fallback: %s", used["fallback_reason"])
        return manifest
