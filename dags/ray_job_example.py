"""Run a Ray script of your own from Airflow: ``RayJobOperator`` with an ``entrypoint``.

`include/example_ray_job/column_profile.py` is plain Ray code that knows nothing of this project:
it profiles a table's numeric columns with one Ray task per column and prints the profile as its
last line, one JSON object. The operator ships the script's folder to the cluster as the job's
`working_dir`, runs it as a Ray job (one submission id per task run, so a retry re-attaches to a
running job; the job's log in the task log; stopped when the task is), and returns that JSON line
as the task's XCom. A script that imports `airflow_ray_ml_stages.job_result` and calls
`report_result({...})` returns its manifest instead. The ``source`` Param comes from whoever
triggers the run, so ``table`` hands it on only if it lies under the allowed sources
(docs/deployment.md#confined-sources). See docs/operators/ray-job.md.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_ray_ml.confine import confine_sources
from airflow_ray_ml.ray_job import RayJobOperator

JOB_DIR = Path(__file__).resolve().parents[1] / "include" / "example_ray_job"

with DAG(
    dag_id="ray_job_example",
    doc_md=__doc__,
    schedule=None,
    catchup=False,
    tags=["ray", "example"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    params={
        "source": Param("", type="string", title="Table",
                        description="A CSV or Parquet file the Ray cluster can read, under the allowed sources "
                                    "(docs/deployment.md#confined-sources); empty: a generated table"),
        "rows": Param(20_000, type="integer", minimum=1, maximum=10_000_000, title="Generated rows"),
    },
):

    @task(doc_md="The `source` Param's table, if it lies under the allowed sources; empty: a generated one.")
    def table(params: dict | None = None) -> str:
        # a path from the trigger form: the job could read any file its node can, so it is confined first
        source = ((params or {}).get("source") or "").strip()
        return confine_sources(source)[0] if source else ""

    RayJobOperator(
        task_id="profile",
        entrypoint="python column_profile.py --rows {{ params.rows }}",
        # the file's name travels as an environment variable, never through the shell of the command line
        runtime_env={"working_dir": str(JOB_DIR), "env_vars": {"PROFILE_SOURCE": table()}},
        entrypoint_num_cpus=0.25,
        metadata={"example": "column_profile"},
    )
