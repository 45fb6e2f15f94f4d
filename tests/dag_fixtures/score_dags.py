"""DAGs for the batch-scoring tests: train one small model, then score files given in run conf."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_score import RayBatchScoreOperator
from airflow_ray_ml.ray_train import RayTrainOperator

START = datetime(2026, 1, 1)

with DAG(dag_id="score_model", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 1500, "seed": 5},
                          poll_interval_s=0.3)
    preprocess = RayDataPreprocessOperator(task_id="preprocess", source=data.output["data_uris"],
                                           label_column="quality", label_range=[0, 10], seed=2,
                                           poll_interval_s=0.3)
    # The published UCI layout without the quality column: the type comes from the file names.
    new_wines = RayJobOperator(task_id="new_wines", stage="generate", poll_interval_s=0.3,
                               spec={"rows": 700, "seed": 99, "file_format": "uci", "with_label": False})
    train = RayTrainOperator(
        task_id="train", config={"family": "xgboost", "num_boost_round": 20}, poll_interval_s=0.3,
        data=preprocess.output,
    )

with DAG(dag_id="score_file", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    RayBatchScoreOperator(task_id="score", input_uri="{{ dag_run.conf['input'] }}",
                          model="{{ dag_run.conf.get('model') }}", batch_size=256, concurrency=1,
                          retries=0, poll_interval_s=0.3)
