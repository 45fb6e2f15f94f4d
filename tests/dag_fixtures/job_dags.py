"""A DAG that runs a script of the test's own as a Ray job (RayJobOperator's entrypoint)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_job import RayJobOperator

# The test writes the script into a folder of its own and names both in the run's conf.
with DAG(dag_id="job_own_script", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={"dir": "", "script": "job.py"}) as job_own_script:
    RayJobOperator(task_id="own", entrypoint="python {{ params.script }} --greeting hello",
                   runtime_env={"working_dir": "{{ params.dir }}"}, entrypoint_num_cpus=0.25,
                   metadata={"team": "growth"}, poll_interval_s=0.3, retries=0)
