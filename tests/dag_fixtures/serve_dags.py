"""DAGs for the Serve tests: train three models of known quality once, then deploy from run conf."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.ray_train import RayTrainOperator

START = datetime(2026, 1, 1)
# Quality by construction: one shallow round learns almost nothing; more rounds learn more.
MODELS = {
    "worse": {"family": "xgboost", "num_boost_round": 1, "eta": 0.05, "max_depth": 2},
    "good": {"family": "xgboost", "num_boost_round": 8, "eta": 0.1, "max_depth": 3},
    "better": {"family": "xgboost", "num_boost_round": 120, "eta": 0.08, "max_depth": 4},
}

with DAG(dag_id="serve_models", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 2000, "seed": 11},
                          poll_interval_s=0.3)
    preprocess = RayDataPreprocessOperator(task_id="preprocess", source=data.output["data_uris"],
                                           label_column="quality", label_range=[0, 10], seed=3,
                                           poll_interval_s=0.3)
    for name, config in MODELS.items():
        RayTrainOperator(task_id=f"train_{name}", config=config, poll_interval_s=0.3, data=preprocess.output)

# A schema change: a champion trained with every column, a challenger whose table lacks alcohol.
with DAG(dag_id="serve_schema_models", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 1500, "seed": 13},
                          poll_interval_s=0.3)
    for name, dropped in (("full", []), ("lacking", ["alcohol"])):
        preprocess = RayDataPreprocessOperator(task_id=f"preprocess_{name}", source=data.output["data_uris"],
                                               label_column="quality", label_range=[0, 10], seed=3,
                                               drop_columns=dropped, poll_interval_s=0.3)
        RayTrainOperator(task_id=f"train_{name}", config=MODELS["good"], poll_interval_s=0.3, data=preprocess.output)


def _deploy_dag(dag_id: str, **kwargs) -> DAG:
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False,
             render_template_as_native_obj=True) as dag:
        RayServeDeployOperator(
            task_id="deploy", model="{{ dag_run.conf['model'] }}",
            data="{{ dag_run.conf['data'] }}",
            min_improvement="{{ dag_run.conf.get('min_improvement', 0.0) }}",
            ready_timeout_s=120, **kwargs,
        )
    return dag


# Their own application, so the wine DAG's test deployment on the same cluster is not touched.
# A retry is allowed: a broken model's rollback must not be retried (one rollback, not two).
serve_deploy = _deploy_dag("serve_deploy", app_name="wine-test", route_prefix="/wine-test", retries=1,
                           retry_delay=timedelta(seconds=1))
serve_deploy_keyed = _deploy_dag("serve_deploy_keyed", app_name="wine-keyed", route_prefix="/keyed",
                                 api_key_conn_id="serve_api_key")
# The request and binding checks get an application of their own, so they need no other test's. It
# names neither: the application and route are the ones derived from the DAG id.
serve_deploy_requests = _deploy_dag("serve_deploy_requests")
# Two DAGs on one application: the second is refused unless the run conf allows the takeover. A
# retry is allowed, so a refusal that were retried would show as a second try.
_SHARED = {"app_name": "wine-shared", "route_prefix": "/shared", "retries": 1, "retry_delay": timedelta(seconds=1),
           "allow_takeover": "{{ dag_run.conf.get('allow_takeover', False) }}"}
serve_shared_a = _deploy_dag("serve_shared_a", **_SHARED)
serve_shared_b = _deploy_dag("serve_shared_b", **_SHARED)
# Instance-wide Serve settings from the run conf.
serve_instance = _deploy_dag("serve_instance", app_name="wine-instance", route_prefix="/instance",
                             serve_instance_options="{{ dag_run.conf.get('serve_instance_options') }}")
# Rolled back and pinned from the "Ray ML" page, through the ray_serve_rollback DAG.
serve_deploy_rollback = _deploy_dag("serve_deploy_rollback", app_name="wine-rollback", route_prefix="/rollback")
# The gate across a schema change, with the setting from the run conf.
serve_schema = _deploy_dag("serve_schema", app_name="wine-schema", route_prefix="/schema",
                           on_schema_change="{{ dag_run.conf['on_schema_change'] }}")
