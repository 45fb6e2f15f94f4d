"""DAGs for the tests of the two Lightning packages: a small Lightning search, then Ray Train (one
worker, not local mode) on its best config. The preprocess manifest comes from the run conf, and
so does the jobs' runtime_env (the test's environment that hides `lightning`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator

START = datetime(2026, 1, 1)
PREPROCESS = "{{ dag_run.conf['preprocess'] }}"
RUNTIME_ENV = "{{ dag_run.conf.get('runtime_env', {}) }}"
LIGHTNING_SPACE = {"family": "lightning", "scaler": "standard",
                   "lightning": {"hidden_sizes": {"choice": [[16], [32, 16]]}, "max_epochs": 3, "patience": 0}}


def _tune_then_train(dag_id: str) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False,
             render_template_as_native_obj=True) as dag:
        tune = RayTuneOperator(task_id="tune", data=PREPROCESS, search_space=LIGHTNING_SPACE, runtime_env=RUNTIME_ENV,
                               num_samples=2, reports_per_trial=1, scheduler="none", poll_interval_s=0.3, retries=0,
                               ensemble_size=0)  # the best trial, trained again on a Ray Train worker
        RayTrainOperator(task_id="train", data=PREPROCESS, config=tune.output["best_config"], runtime_env=RUNTIME_ENV,
                         num_workers=1, poll_interval_s=0.3, retries=0)
    return dag


# Jobs whose every process has `lightning` hidden (tests/hidden_packages.py): pytorch_lightning.
lightning_hidden = _tune_then_train("lightning_hidden")

# A config XGBoost refuses inside the Ray Train worker (XGBoostError is a ValueError): however many
# retries the task has, another try would fail the same way.
with DAG(dag_id="train_refused_on_the_worker", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True) as train_refused_on_the_worker:
    RayTrainOperator(task_id="train", data=PREPROCESS, num_workers=1, max_failures=0, poll_interval_s=0.3,
                     config={"family": "xgboost", "num_boost_round": 5, "tree_method": "no_such_method"},
                     retries=2, retry_delay=timedelta(seconds=1))
