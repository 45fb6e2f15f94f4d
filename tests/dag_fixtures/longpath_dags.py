"""A 5-round XGBoost trained on the run conf's splits (a preprocess XCom), then deployed, on the cluster
that connection ``ray_longpath`` names: the one tests/test_localcluster.py starts from a checkout with a
long path."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.ray_train import RayTrainOperator

CONN_ID = "ray_longpath"

with DAG(dag_id="longpath_serve", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         render_template_as_native_obj=True):
    train = RayTrainOperator(
        task_id="train", config={"family": "xgboost", "num_boost_round": 5, "eta": 0.3, "max_depth": 3},
        ray_conn_id=CONN_ID, poll_interval_s=0.3, data="{{ dag_run.conf['preprocess'] }}",
    )
    RayServeDeployOperator(
        task_id="deploy", model=train.output, data="{{ dag_run.conf['preprocess'] }}",
        app_name="longpath", route_prefix="/longpath", ready_timeout_s=120, ray_conn_id=CONN_ID,
    )
