"""DAGs for the RayTrainOperator tests: the splits and config come from the run conf."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_ray_ml.gpu_probe import GPUProbeOperator
from airflow_ray_ml.ray_train import RayTrainOperator

START = datetime(2026, 1, 1)
# the splits as a preprocess task's XCom, and the config, from the run conf
DATA = {"data": "{{ dag_run.conf['data'] }}", "config": "{{ dag_run.conf['config'] }}"}


def _train_dag(dag_id: str, probe: bool = False, **train_kwargs) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False,
             render_template_as_native_obj=True) as dag:
        if probe:
            train_kwargs["compute"] = "{{ ti.xcom_pull('probe') }}"
        train = RayTrainOperator(task_id="train", poll_interval_s=0.3, **DATA, **train_kwargs)
        if probe:
            GPUProbeOperator(task_id="probe", ray_conn_id=train_kwargs.get("ray_conn_id", "ray_default")) >> train
    return dag


# Probe, then train with its compute spec (a CPU one on the tests' cluster); the run conf's config
# stands in for RayTune's best config.
train_lightning = _train_dag("train_lightning", probe=True)
train_xgboost = _train_dag("train_xgboost", probe=True)
# One real Ray Train worker (not local mode) so there is a worker process to kill.
train_resume = _train_dag("train_resume", num_workers=1, checkpoint_every=1, max_failures=2)
train_resume_xgboost = _train_dag("train_resume_xgboost", num_workers=1, checkpoint_every=5, max_failures=2)
# A GPU compute spec on the tests' cluster, which advertises no GPU: the placement never comes.
# accelerator="gpu", since the device rule keeps a table this small on CPU anyway.
train_gpu_fallback = _train_dag(
    "train_gpu_fallback", gpu_placement_timeout_s=3, accelerator="gpu",
    compute={"use_gpu": True, "gpus_per_worker": 1, "num_workers": 1, "cpus_per_worker": 1,
             "accelerator": "gpu", "reason": "test: a GPU compute spec"},
)
# Whatever GPU the cluster has (the gpu-marked tests point ray_gpu at a cluster with a real one).
# The probe decides (a real CUDA smoke test) and training takes its compute spec: on the GPU as
# told (accelerator="gpu"), or where the device rule puts the wine table (auto: on CPU).
train_gpu = _train_dag("train_gpu", probe=True, ray_conn_id="ray_gpu", gpu_placement_timeout_s=30,
                       accelerator="gpu")
train_gpu_auto = _train_dag("train_gpu_auto", probe=True, ray_conn_id="ray_gpu", gpu_placement_timeout_s=30)
# Far more workers than the tests' 2-CPU cluster has CPUs: refused before any job (retries unused).
train_too_many_workers = _train_dag("train_too_many_workers", num_workers=500, retries=2)
# One Ray Train worker of 1 CPU on the cluster that ray_sized names (where Serve apps hold most CPUs).
train_held = _train_dag("train_held", ray_conn_id="ray_sized", num_workers=1, resource_wait_s=5, retries=1,
                        retry_delay=timedelta(seconds=1))
