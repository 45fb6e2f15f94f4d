"""The DAG for the batch-scoring tests: score a file given in run conf, with a model given there
(the session's ``trained_models``, tests/conftest.py) or a model directory."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_score import RayBatchScoreOperator

START = datetime(2026, 1, 1)

with DAG(dag_id="score_file", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    RayBatchScoreOperator(task_id="score", input_uri="{{ dag_run.conf['input'] }}",
                          model="{{ dag_run.conf.get('model') }}", engine="{{ dag_run.conf.get('engine', 'auto') }}",
                          batch_size=256, concurrency=1,
                          retries=0, poll_interval_s=0.3)
