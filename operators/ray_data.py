"""RayDataPreprocessOperator: validated, reproducible, streaming preprocessing as a Ray job."""

from __future__ import annotations

from typing import ClassVar

from airflow_ray_ml.stage import StageOperator
from airflow_ray_ml_stages.specs import PreprocessSpec


class RayDataPreprocessOperator(StageOperator):
    """Validate a table, split it, fit a scaler on the train split and write Parquet, as a Ray job.

    Runs the ``data`` stage (``python -m airflow_ray_ml_stages.data``) as a Ray job; the Airflow worker never
    loads the data. The XCom is the stage's manifest (``airflow_ray_ml_stages.specs.PreprocessResult``):
    ``split_uris`` (Parquet directories per split), ``preprocessor_uri`` (JSON, loaded without
    pickle by :class:`airflow_ray_ml_stages.preprocessor.Preprocessor`) and its ``preprocessor_variants``,
    ``feature_columns``, ``label_column``, ``profile_uri``, row counts, the input ``fingerprint``,
    ``task`` and, for ``task="classification"``, ``classes`` (the splits' label holds each row's
    index into them; the split is stratified by class). Hand it on as it is: ``RayTuneOperator(data=preprocess.output)``,
    ``RayTrainOperator(data=preprocess.output)``, ``RayServeDeployOperator(data=preprocess.output)``.

    ``source`` may be an XComArg too, e.g. ``source=make_data.output`` of a task returning file URIs.
    Other arguments: :class:`~airflow_ray_ml.ray_job.RayJobOperator`'s (``ray_conn_id``,
    ``artifact_root``, ``deferrable``, ...) and BaseOperator's.
    """

    spec_type: ClassVar[type] = PreprocessSpec
    ui_color = "#e3f2fd"
