"""Small DAGs the integration tests run with dag.test(); they live in their own DAG bundle."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator


def _generate_dag(dag_id: str, rows: int, deferrable: bool = False) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        RayJobOperator(task_id="make_data", stage="generate", spec={"rows": rows, "seed": 3},
                       deferrable=deferrable, poll_interval_s=0.3)
    return dag


core_manifest = _generate_dag("core_manifest", rows=500)
core_deferred = _generate_dag("core_deferred", rows=500, deferrable=True)

# The job starts, then cannot write its artifacts: it crashes before any manifest.
with DAG(dag_id="core_crashing_job", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as core_crashing_job:
    RayJobOperator(task_id="broken", stage="generate", spec={"rows": 10}, artifact_root="/proc/rayml-not-writable",
                   poll_interval_s=0.3)

# Anyone allowed to trigger a DAG sets its conf: a stage name from there must never reach a shell.
with DAG(dag_id="core_stage_from_conf", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as core_stage_from_conf:
    RayJobOperator(task_id="from_conf", stage="{{ dag_run.conf['stage'] }}", spec={"rows": 10}, poll_interval_s=0.3,
                   retries=2, retry_delay=timedelta(seconds=1))

# A task instance in the metadata DB for tests that need one (its task does nothing).
with DAG(dag_id="core_noop", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as core_noop:
    EmptyOperator(task_id="noop")

# Bad data in a file the run's conf names: the preprocess stage's error, after one try of three.
with DAG(dag_id="core_bad_data", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as core_bad_data:
    RayDataPreprocessOperator(task_id="preprocess", source="{{ dag_run.conf['source'] }}", label_column="y",
                              poll_interval_s=0.3, retries=2, retry_delay=timedelta(seconds=1))

# Long jobs (minutes of generating) for the tests that stop them: by execution_timeout, or by the
# SIGTERM a task process gets when its task or DAG run is marked failed.
with DAG(dag_id="core_execution_timeout", schedule=None, start_date=datetime(2026, 1, 1),
         catchup=False) as core_execution_timeout:
    RayJobOperator(task_id="make_data", stage="generate", spec={"rows": 2_000_000, "seed": 3}, deferrable=False,
                   poll_interval_s=0.3, execution_timeout=timedelta(seconds=8))
core_sigterm = _generate_dag("core_sigterm", rows=2_000_000)


class _AttemptLostOperator(RayJobOperator):
    """Its first try ends while its job runs, as a worker that died would (no on_kill); Airflow's
    retry then runs the task again."""

    def wait(self, submission_id: str) -> int:
        import time

        from airflow.sdk import get_current_context

        if get_current_context()["ti"].try_number == 1:
            while self.hook.get_job_status(submission_id).value != "RUNNING":
                time.sleep(0.1)
            raise RuntimeError(f"test: the first try's worker is lost while Ray job {submission_id} runs")
        return super().wait(submission_id)


with DAG(dag_id="core_retry_attaches", schedule=None, start_date=datetime(2026, 1, 1),
         catchup=False) as core_retry_attaches:
    _AttemptLostOperator(task_id="make_data", stage="generate", spec={"rows": 400_000, "seed": 3}, deferrable=False,
                         poll_interval_s=0.3, retries=1, retry_delay=timedelta(seconds=1))
