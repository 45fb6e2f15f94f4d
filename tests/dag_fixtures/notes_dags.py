"""DAGs for the failure notes: a task that fails naming its fix, in a DAG of this provider and in one without.

The failing task is plain Python, so no Ray cluster is needed; the Ray job after it never runs.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, BaseHook, task

from airflow_ray_ml.ray_job import RayJobOperator

START = datetime(2026, 1, 1)
SECRET_CONN_ID = "notes_secret"  # the test defines it (AIRFLOW_CONN_NOTES_SECRET) with a password
# A multi-line error whose first line names the fix, as the project's errors do.
ERROR = ("the table has 3 rows, fewer than the 10 the split needs; give a table with more rows or lower "
         "min_rows\nsecond line: never in a note")


@task(retries=0)
def check_rows() -> None:
    raise ValueError(ERROR)


with DAG(dag_id="notes_provider_failure", schedule=None, start_date=START, catchup=False) as notes_provider_failure:
    check_rows() >> RayJobOperator(task_id="job", entrypoint="python -c 'print(1)'", retries=0)

@task(retries=0)
def log_in() -> None:
    connection = BaseHook.get_connection(SECRET_CONN_ID)  # registers its password with the secrets masker
    raise PermissionError(f"the service refused {connection.login}:{connection.password}; set a valid password")


with DAG(dag_id="notes_secret_failure", schedule=None, start_date=START, catchup=False) as notes_secret_failure:
    log_in() >> RayJobOperator(task_id="job", entrypoint="python -c 'print(1)'", retries=0)

with DAG(dag_id="notes_plain_failure", schedule=None, start_date=START, catchup=False) as notes_plain_failure:
    check_rows()
