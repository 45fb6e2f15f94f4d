"""RayDataPreprocessOperator builds its spec in Airflow and refuses a bad one before any job."""

from __future__ import annotations

from datetime import datetime

import pytest

from airflow_ray_ml.errors import InvalidSpecError
from airflow_ray_ml.ray_data import RayDataPreprocessOperator


def _operator(**kwargs) -> RayDataPreprocessOperator:
    from airflow.sdk import DAG

    with DAG(dag_id="data_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        return RayDataPreprocessOperator(task_id="preprocess", source=["/data/flats.csv"], **kwargs)


class _TI:
    dag_id = "data_unit"
    map_index = -1


def test_preprocess_operator_without_label_column_fails_before_any_job_naming_it(tmp_path):
    operator = _operator(artifact_root=str(tmp_path))
    with pytest.raises(InvalidSpecError) as caught:
        operator.full_spec({"ti": _TI(), "run_id": "r1"})
    assert str(caught.value) == ("task 'preprocess': invalid data spec: PreprocessSpec.label_column is required: "
                                 "the column to predict (label_column='<column>'); got ''")


def test_preprocess_operator_label_column_from_a_param_reaches_the_spec(tmp_path):
    operator = _operator(label_column="{{ params.label }}", artifact_root=str(tmp_path))
    operator.render_template_fields({"params": {"label": "rent"}})
    assert operator.full_spec({"ti": _TI(), "run_id": "r1"})["label_column"] == "rent"
