"""DAGs for the RayTuneOperator tests: the preprocess manifest and the search space come from the run conf."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator

START = datetime(2026, 1, 1)
# Small on purpose (2 CPUs shared with other tests): 4 trials, half a CPU each, two at a time.
SMALL = {"num_samples": 4, "cpus_per_trial": 0.5, "max_concurrent_trials": 2, "reports_per_trial": 2}
# Run first, before any random sample: one config of each family (XGBoost grown as a forest sets keys the
# space does not name, as do the two scikit-learn forests).
START_CONFIGS = [
    {"family": "lightning", "scaler": "minmax", "hidden_sizes": [32, 16], "lr": 0.005},
    {"family": "xgboost", "num_parallel_tree": 10, "num_boost_round": 1, "eta": 1.0, "max_depth": 4,
     "subsample": 0.632, "colsample_bynode": 0.8},
    {"family": "extra_trees", "max_features": 0.8, "max_depth": 12},
    {"family": "random_forest", "scaler": "minmax", "min_samples_leaf": 2, "max_depth": 12},
]


def _tune(**kwargs) -> RayTuneOperator:
    return RayTuneOperator(task_id="tune", data="{{ dag_run.conf['preprocess'] }}",
                           search_space="{{ dag_run.conf['search_space'] }}", poll_interval_s=0.3, **SMALL, **kwargs)


# Tune, then train the best config as RayTrain would in the pipeline: config is the XCom as is.
with DAG(dag_id="tune_then_train", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True) as tune_then_train:
    tune = _tune(start_configs=START_CONFIGS)
    RayTrainOperator(task_id="train", poll_interval_s=0.3, data="{{ dag_run.conf['preprocess'] }}",
                     config=tune.output["best_config"])

# Tune alone (a search whose trials all fail ends here).
with DAG(dag_id="tune_only", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True) as tune_only:
    _tune(retries=0)

# Optuna's TPE instead of random search, every trial to its end.
with DAG(dag_id="tune_optuna", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True) as tune_optuna:
    _tune(searcher="optuna", scheduler="none")



def _sized_dag(dag_id: str, ray_conn_id: str, trials: int) -> DAG:
    """Trials sized by the stage (no cpus_per_trial or max_concurrent_trials unless the conf says), on
    the cluster ``ray_conn_id`` names: ``trials`` trials of XGBoost, every one to its end."""
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False,
             render_template_as_native_obj=True) as dag:
        RayTuneOperator(task_id="tune", data="{{ dag_run.conf['preprocess'] }}",
                        search_space="{{ dag_run.conf['search_space'] }}", poll_interval_s=0.3,
                        ray_conn_id=ray_conn_id, num_samples=trials, reports_per_trial=2, scheduler="none",
                        start_configs=[], retries=1, retry_delay=timedelta(seconds=1),
                        cpus_per_trial="{{ dag_run.conf.get('cpus_per_trial') }}",
                        resource_wait_s="{{ dag_run.conf.get('resource_wait_s', 120) }}")
    return dag


tune_sized = _sized_dag("tune_sized", "ray_sized", trials=8)  # a 2-CPU cluster where Serve apps hold most CPUs
# a cluster advertising 8 CPUs: one wave of the six trials it runs at once (two CPUs kept for Ray Data)
tune_eight_cpus = _sized_dag("tune_eight_cpus", "ray_eight", trials=6)
