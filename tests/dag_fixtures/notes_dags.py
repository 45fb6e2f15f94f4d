"""DAGs for the failure notes: a task that fails naming its fix, in a DAG of this provider and in one without.

The failing task is plain Python, so no Ray cluster is needed; the Ray job after it never runs.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from airflow_ray_ml.ray_job import RayJobOperator

START = datetime(2026, 1, 1)
# A multi-line error whose first line names the fix, as the project's errors do.
ERROR = ("the table has 3 rows, fewer than the 10 the split needs; give a table with more rows or lower "
         "min_rows\nsecond line: never in a note")


@task(retries=0)
def check_rows() -> None:
    raise ValueError(ERROR)


with DAG(dag_id="notes_provider_failure", schedule=None, start_date=START, catchup=False) as notes_provider_failure:
    check_rows() >> RayJobOperator(task_id="job", entrypoint="python -c 'print(1)'", retries=0)

with DAG(dag_id="notes_plain_failure", schedule=None, start_date=START, catchup=False) as notes_plain_failure:
    check_rows()
