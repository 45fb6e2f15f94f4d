"""The DAGs behind the "Ray ML" page tests: a small real search, its best model trained and served.

``ray_ml_page_serve`` runs the real RayTuneOperator (a few short trials of both families), trains
the best config and deploys it with the real RayServeDeployOperator, on its own application so
other Serve tests on the same cluster are not touched.

``ray_ml_page_followup`` reuses that run's data and model (its run conf: ``data``, ``model``): a
second, one-trial search (a second Tune run for the page's picker) and a second deploy of the same
model to the same application, which keeps the champion, since no model is ``min_improvement``
better (a kept champion in the version history).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator

START = datetime(2026, 1, 1)
UI_APP = "wine-ui"
UI_ROUTE = "/wine-ui"

with DAG(dag_id="ray_ml_page_serve", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 1200, "seed": 5},
                          poll_interval_s=0.3)
    preprocess = RayDataPreprocessOperator(task_id="preprocess", source=data.output["data_uris"],
                                           label_column="quality", label_range=[0, 10], seed=3,
                                           poll_interval_s=0.3)
    tune = RayTuneOperator(
        task_id="tune", data=preprocess.output, num_samples=4, poll_interval_s=0.3,
        search_space={"family": {"choice": ["xgboost", "lightning"]}, "scaler": {"choice": ["standard", "minmax"]},
                      "xgboost": {"num_boost_round": 20, "max_depth": {"randint": [2, 6]}},
                      "lightning": {"max_epochs": 2, "hidden_sizes": [16]}},
    )
    train = RayTrainOperator(task_id="train", data=preprocess.output, config=tune.output["best_config"],
                             poll_interval_s=0.3)
    RayServeDeployOperator(
        task_id="deploy", model=train.output, data=preprocess.output,
        app_name=UI_APP, route_prefix=UI_ROUTE, ready_timeout_s=120, force=True,
    )

with DAG(dag_id="ray_ml_page_followup", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    RayTuneOperator(
        task_id="tune", data="{{ dag_run.conf['data'] }}", num_samples=1, poll_interval_s=0.3,
        search_space={"family": "xgboost", "scaler": "standard", "xgboost": {"num_boost_round": 10, "max_depth": 3}},
    )
    RayServeDeployOperator(
        task_id="deploy", model="{{ dag_run.conf['model'] }}", data="{{ dag_run.conf['data'] }}",
        app_name=UI_APP, route_prefix=UI_ROUTE, ready_timeout_s=120, min_improvement=1e6,
        # the application is ray_ml_page_serve's; a kept champion changes nothing of it
        allow_takeover=True,
    )
