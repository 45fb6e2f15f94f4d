"""DAGs for the Serve and scoring tests: train three models of known quality once per test session
(``tests/conftest.py``'s ``trained_models``), then deploy from run conf."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset

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
    # New rows to score, in the published UCI layout without the quality column (the type comes
    # from the file names).
    RayJobOperator(task_id="new_wines", stage="generate", poll_interval_s=0.3,
                   spec={"rows": 700, "seed": 99, "file_format": "uci", "with_label": False})

# A schema change: the champion is serve_models' good model, trained with every column; the
# challenger is the same model trained on the same files (the run conf's source) without alcohol.
with DAG(dag_id="serve_schema_lacking", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    preprocess = RayDataPreprocessOperator(task_id="preprocess", source="{{ dag_run.conf['source'] }}",
                                           label_column="quality", label_range=[0, 10], seed=3,
                                           drop_columns=["alcohol"], poll_interval_s=0.3)
    RayTrainOperator(task_id="train", config=MODELS["good"], poll_interval_s=0.3, data=preprocess.output)


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
# A retry is allowed: a broken model's rollback must not be retried (one rollback, not two). Its
# Asset, as the wine pipeline's deploy has one: an event for each promotion only.
SERVE_DEPLOY_MODEL = Asset("serve_deploy_model")
serve_deploy = _deploy_dag("serve_deploy", app_name="wine-test", route_prefix="/wine-test", retries=1,
                           retry_delay=timedelta(seconds=1), outlets=[SERVE_DEPLOY_MODEL])
serve_deploy_keyed = _deploy_dag("serve_deploy_keyed", app_name="wine-keyed", route_prefix="/keyed",
                                 api_key_conn_id="serve_api_key")
# The session's served champion (tests/conftest.py's ``served_champion``), which tests only read. It
# names neither application nor route: both are derived from the DAG id. A tenth of a CPU, since it
# stays up all session beside the stages that need the test cluster's two.
serve_champion = _deploy_dag("serve_champion", replica_cpus=0.1)
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
# A challenger tried on live traffic first (tests/operators/test_serve_rollout.py): shadow or canary,
# its share and a label file from the run conf, sized so that a test waits seconds, not minutes.
# The challengers have 15 times the champion's trees: on a loaded 2-core runner their median answer
# time reached 2.4 times the champion's, past the default limit of 2, and the trial kept the
# champion. These tests are about routing, records and promotion; the answer-time rule has its own
# (test_verdict_rolls_back_keeps_or_promotes_and_says_why).
_ROLLOUT = {"rollout": "{{ dag_run.conf.get('rollout', 'direct') }}", "rollout_share": "{{ dag_run.conf.get('share') }}",
            "rollout_labels": "{{ dag_run.conf.get('labels') }}", "rollout_rows": 300, "rollout_timeout_s": 60,
            "replica_cpus": 0.1, "max_latency_ratio": 10.0}
serve_rollout = _deploy_dag("serve_rollout", app_name="wine-rollout", route_prefix="/rollout", **_ROLLOUT)
serve_canary = _deploy_dag("serve_canary", app_name="wine-canary", route_prefix="/canary", **_ROLLOUT)
# The same, with a person's approval before the promotion (Airflow's Human-in-the-loop form). An
# answer that never resumes the task ends the wait as a rejection after 5 minutes (the test's
# approver gives up after 4), so the test fails saying so instead of waiting out its timeout.
serve_approval = _deploy_dag("serve_approval", app_name="wine-approval", route_prefix="/approval", approval=True,
                             approval_timeout=timedelta(minutes=5), **_ROLLOUT)
