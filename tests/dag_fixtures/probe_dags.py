"""DAGs for the GPU probe tests: on the tests' CPU-only cluster and on one that advertises a GPU."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_ray_ml.gpu_probe import GPUProbeOperator, branch_on_compute

START = datetime(2026, 1, 1)

with DAG(dag_id="probe_cpu_wait", schedule=None, start_date=START, catchup=False):
    GPUProbeOperator(task_id="probe", wait_for_gpu_s=2)

# The fake-GPU cluster is reached through its own connection, set by the test fixture.
with DAG(dag_id="probe_fake_gpu", schedule=None, start_date=START, catchup=False):
    GPUProbeOperator(task_id="probe", ray_conn_id="ray_fake_gpu", smoke_timeout_s=60)

with DAG(dag_id="probe_fake_gpu_required", schedule=None, start_date=START, catchup=False):
    GPUProbeOperator(task_id="probe", ray_conn_id="ray_fake_gpu", require_gpu=True)

# On the tests' CPU-only cluster: what the probe decides, and the branch it picks.
with DAG(dag_id="probe_branch", schedule=None, start_date=START, catchup=False):
    probe = GPUProbeOperator(task_id="probe")

    @task.branch
    def choose(compute: dict) -> str:
        return branch_on_compute(compute, gpu="train_on_gpu", cpu="train_on_cpu")

    choose(probe.output) >> [EmptyOperator(task_id="train_on_gpu"), EmptyOperator(task_id="train_on_cpu")]
