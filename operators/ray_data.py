"""RayDataPreprocessOperator: validated, reproducible, streaming preprocessing as a Ray job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from operators.errors import RayOperatorError
from operators.ray_job import RayJobOperator

if TYPE_CHECKING:
    from airflow.sdk import Context


class RayDataPreprocessOperator(RayJobOperator):
    """Validate a table, split it, fit a scaler on the train split and write Parquet, as a Ray job.

    Runs the ``data`` stage (``python -m rayml.data``) as a Ray job; the Airflow worker never
    loads the data. The XCom is the stage's manifest: ``split_uris`` (Parquet directories per
    split), ``preprocessor_uri`` (JSON, loaded without pickle by
    :class:`rayml.preprocessor.Preprocessor`), ``profile_uri``, row counts and the input
    fingerprint.

    :param source: input files (CSV, the UCI semicolon CSV, or Parquet; local paths, ``s3://``,
        ``gs://``, ``http(s)://``). None: the ``data_uris`` of the manifest that ``source_task_id``
        returned. (templated)
    :param source_task_id: the upstream task whose manifest names the data when ``source`` is None.
    :param label_column: the column to predict. (templated)
    :param feature_columns: input feature columns; None: every column but the label and
        ``drop_columns``. When given, other columns are an error. (templated)
    :param categorical_columns: feature columns to one-hot encode; None: detect the non-numeric
        ones (the wine ``type``). (templated)
    :param drop_columns: input columns to ignore. (templated)
    :param split: ``[train, validation, test]`` fractions summing to 1. (templated)
    :param seed: split seed; same input and seed give the same split on any cluster. (templated)
    :param scaler: ``standard``, ``minmax`` or ``none``, fitted on the train split. (templated)
    :param nan_policy: ``fail`` on NaN/infinite/missing values, or ``drop`` and count. (templated)
    :param label_range: ``[low, high]``; labels outside it fail the task. (templated)
    :param delimiter: CSV delimiter, or ``auto``. (templated)
    :param file_format: ``auto``, ``csv`` or ``parquet``. (templated)
    :param max_categories: most distinct values a categorical column may have.
    :param override_num_blocks: Ray Data read parallelism; None: one block per file (the output does not depend on it).
    :param engine: ``auto``, ``direct`` (pyarrow in the job's driver) or ``ray_data``; ``auto`` runs
        direct up to ``direct_max_bytes`` of input or on a one-node cluster. The output does not
        depend on it. (templated)
    :param direct_max_bytes: input size up to which ``auto`` runs direct without asking the cluster.
    :param kwargs: :class:`~operators.ray_job.RayJobOperator` arguments (``ray_conn_id``,
        ``artifact_root``, ``deferrable``, ...) and BaseOperator's.
    """

    template_fields: Sequence[str] = (
        *RayJobOperator.template_fields, "source", "label_column", "feature_columns", "categorical_columns",
        "drop_columns", "split", "seed", "scaler", "nan_policy", "label_range", "delimiter", "file_format",
        "engine",
    )

    def __init__(
        self,
        *,
        source: list[str] | str | None = None,
        source_task_id: str | None = "demo_data",
        label_column: str = "quality",
        feature_columns: list[str] | None = None,
        categorical_columns: list[str] | None = None,
        drop_columns: list[str] | None = None,
        split: list[float] | None = None,
        seed: int = 0,
        scaler: str = "standard",
        nan_policy: str = "fail",
        label_range: list[float] | None = None,
        delimiter: str = "auto",
        file_format: str = "auto",
        max_categories: int = 100,
        override_num_blocks: int | None = None,
        engine: str = "auto",
        direct_max_bytes: int = 2 * 1024**3,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("stage", "data")
        super().__init__(**kwargs)
        self.source = source
        self.source_task_id = source_task_id
        self.label_column = label_column
        self.feature_columns = feature_columns
        self.categorical_columns = categorical_columns
        self.drop_columns = drop_columns or []
        self.split = split or [0.7, 0.15, 0.15]
        self.seed = seed
        self.scaler = scaler
        self.nan_policy = nan_policy
        self.label_range = label_range
        self.delimiter = delimiter
        self.file_format = file_format
        self.max_categories = max_categories
        self.override_num_blocks = override_num_blocks
        self.engine = engine
        self.direct_max_bytes = direct_max_bytes

    def resolve_source(self, context: Context) -> list[str]:
        if self.source:
            return [self.source] if isinstance(self.source, str) else list(self.source)
        if not self.source_task_id:
            raise RayOperatorError(f"task {self.task_id!r}: give source, or source_task_id of a task returning data_uris")
        manifest = context["ti"].xcom_pull(task_ids=self.source_task_id)
        uris = (manifest or {}).get("data_uris") if isinstance(manifest, dict) else None
        if not uris:
            raise RayOperatorError(
                f"task {self.task_id!r}: no source given and task {self.source_task_id!r} returned no data_uris "
                f"(got {manifest!r}); set source, or source_task_id to the task that writes the data"
            )
        return list(uris)

    def build_spec(self, context: Context) -> dict[str, Any]:
        return {
            "source": self.resolve_source(context),
            "label_column": self.label_column,
            "feature_columns": self.feature_columns,
            "categorical_columns": self.categorical_columns,
            "drop_columns": list(self.drop_columns),
            "split": list(self.split),
            "seed": self.seed,
            "scaler": self.scaler,
            "nan_policy": self.nan_policy,
            "label_range": self.label_range,
            "delimiter": self.delimiter,
            "file_format": self.file_format,
            "max_categories": self.max_categories,
            "override_num_blocks": self.override_num_blocks,
            "engine": self.engine,
            "direct_max_bytes": self.direct_max_bytes,
        }
