"""A DAG of ``@task.ray`` functions, run once with dag.test() by tests/operators/decorators/test_ray.py.

One run holds every case: a dict returned as the XCom (deferred, so the result also comes back
through the trigger), that XCom passed on as another function's argument by a task whose first try
is lost while its job runs (the retry re-attaches), and a function that raises.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from airflow.sdk.bases.decorator import task_decorator_factory

from airflow_ray_ml.decorators.ray import RayDecoratedOperator


class _AttemptLostRayTask(RayDecoratedOperator):
    """Its first try ends while its job runs, as a worker that died would (no on_kill); Airflow's retry
    then runs the task again."""

    def wait(self, submission_id: str) -> int:
        import time

        from airflow.sdk import get_current_context

        if get_current_context()["ti"].try_number == 1:
            while self.hook.get_job_status(submission_id).value != "RUNNING":
                time.sleep(0.1)
            raise RuntimeError(f"test: the first try's worker is lost while Ray job {submission_id} runs")
        return super().wait(submission_id)


def _attempt_lost_task(**kwargs):
    return task_decorator_factory(decorated_operator_class=_AttemptLostRayTask, **kwargs)


with DAG(dag_id="task_ray", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}) as task_ray:

    @task.ray(deferrable=True, poll_interval_s=0.3, runtime_env={"env_vars": {"GREETING": "hello"}})
    def totals(rows: int, names: list[str], scale: float = 0.5) -> dict:
        import os

        print(f"summing {rows} rows for {len(names)} names")
        return {"rows": rows, "total": sum(range(rows)) * scale, "names": sorted(names),
                "greeting": os.environ["GREETING"], "artifact_dir": os.environ["RAYML_ARTIFACT_DIR"]}

    @_attempt_lost_task(retries=1, retry_delay=timedelta(seconds=1), poll_interval_s=0.3)
    def echo_slowly(summary: dict, seconds: float) -> list:
        import time

        time.sleep(seconds)  # long enough for the lost first try's retry to find the job still running
        return [summary["total"], summary["names"]]

    @task.ray(poll_interval_s=0.3)
    def broken(table: str) -> None:
        prices = {"row 1": "12.5", "row 2": "n/a"}
        for row, price in prices.items():
            if not price.replace(".", "").isdigit():
                raise ValueError(f"{table}: column 'price' has text {price!r} in {row}; clean the export")

    echo_slowly(totals(rows=100, names=["b", "a"]), seconds=8)
    broken("sales.csv")
