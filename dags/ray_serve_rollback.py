"""Serve an earlier model of a Ray Serve application again: roll back, or pin a version.

The "Ray ML" page starts this DAG when a person clicks "Roll back" or "Pin" (only people Airflow
lets trigger it, and the DAG that owns the application, can); it can also be triggered from the
UI or the REST API with the Params below. A rollback serves the model promoted before the live
one; a pin serves the version named. Each run restores the application's config as that model's
promotion applied it, checks the endpoint answers with that version, and records the decision in
the application's serving history and as the task's note.

Copy this file into your own DAGs folder to get the page's buttons in your Airflow; the page
finds it by ``[ray_ml] serve_action_dag_id`` (default ``ray_serve_rollback``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_ray_ml.serve_apps import APP_NAME
from airflow_ray_ml.ray_serve_rollback import VERSION, RayServeRollbackOperator

with DAG(
    dag_id="ray_serve_rollback",
    description="Serve an earlier model of a Ray Serve application again (rollback or pin)",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,  # the page's buttons start runs at once
    max_active_runs=1,  # one change to Serve at a time
    default_args={"retries": 1, "retry_delay": timedelta(seconds=15)},
    params={
        # No default: a rollback runs in this DAG, not in the DAG that deployed, so nothing here
        # says which application to change (the page always names it).
        "app_name": Param(type="string", title="Serve application", pattern=f"^{APP_NAME.pattern}$",
                          description="The application to change, as the deploy named it (its DAG's id "
                                      "unless the deploy set app_name)"),
        "version": Param(None, type=["null", "string"], title="Model version",
                         pattern=f"^({VERSION.pattern})?$",
                         description="The version to serve; empty: the model promoted before the live one"),
        "reason": Param(None, type=["null", "string"], title="Reason", maxLength=500,
                        description="Why, in words; kept in the serving history and the task's note"),
    },
    tags=["ray", "serve"],
    doc_md=__doc__,
):
    RayServeRollbackOperator(
        task_id="serve_again",
        app_name="{{ params.app_name }}",
        version="{{ params.version }}",
        reason="{{ params.reason }}",
        doc_md="Serve the previous model, or the version given, on the application.",
    )
