"""A small DAG for the data stage: generate the demo data, then preprocess it with each engine."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator

with DAG(dag_id="data_preprocess", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as data_preprocess:
    demo_data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 800, "seed": 3},
                               poll_interval_s=0.3)
    files = demo_data.output["data_uris"]
    preprocess = RayDataPreprocessOperator(task_id="preprocess", source=files, label_column="quality",
                                           label_range=[0, 10], seed=5, poll_interval_s=0.3)
    preprocess_ray_data = RayDataPreprocessOperator(task_id="preprocess_ray_data", source=files,
                                                    label_column="quality", label_range=[0, 10], seed=5,
                                                    engine="ray_data",
                                                    poll_interval_s=0.3)
