"""Small DAGs for bench/bench_faults.py: each runs one stage operator on inputs from the run conf.

The bench loads this file (and only this file) as a DAG bundle of its own and runs these DAGs with
``dag.test()``, the way the tests run theirs. ``conf['data']`` is a preprocess task's XCom (the
data stage's manifest), ``conf['config']`` a train config, ``conf['model']`` a train task's XCom.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator

START = datetime(2026, 1, 1)
DATA = "{{ dag_run.conf['data'] }}"
CONFIG = "{{ dag_run.conf['config'] }}"


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, render_template_as_native_obj=True)


# A promotion as the wine DAG's deploy task makes it, to an application of the bench's own.
with _dag("fault_deploy") as fault_deploy:
    RayServeDeployOperator(task_id="deploy", model="{{ dag_run.conf['model'] }}", data=DATA,
                           app_name="fault-wine", route_prefix="/fault-wine", ready_timeout_s=120)

# A search whose task process the bench SIGKILLs while the job runs; dag.test() again is the retry.
with _dag("fault_tune") as fault_tune:
    RayTuneOperator(task_id="tune", data=DATA, search_space="{{ dag_run.conf['search_space'] }}",
                    num_samples="{{ dag_run.conf['num_samples'] }}", cpus_per_trial=1, max_concurrent_trials=2,
                    scheduler="none", poll_interval_s=0.3)

# The same for training: local mode, in the job's own process.
with _dag("fault_train") as fault_train:
    RayTrainOperator(task_id="train", data=DATA, config=CONFIG, num_workers=0, poll_interval_s=0.3)

# One real Ray Train worker that checkpoints every epoch, so there is a worker process to kill and a
# checkpoint to resume from.
with _dag("fault_train_worker") as fault_train_worker:
    RayTrainOperator(task_id="train", data=DATA, config=CONFIG, num_workers=1, checkpoint_every=1,
                     max_failures=2, poll_interval_s=0.3)

# Training whose cluster the bench stops mid-run: Airflow retries the task after retry_delay, by
# which time the bench has started a new cluster on the same ports.
with _dag("fault_head") as fault_head:
    RayTrainOperator(task_id="train", data=DATA, config=CONFIG, num_workers=0, poll_interval_s=0.3,
                     retries=2, retry_delay=timedelta(seconds=30))
