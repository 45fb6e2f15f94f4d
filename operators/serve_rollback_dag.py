"""serve_rollback_dag: the DAG that the "Ray ML" page's Roll back and Pin buttons run, shipped with the provider.

A team enables it with one call in a file of its DAGs folder (this project's
``dags/ray_serve_rollback.py`` is that file)::

    from airflow_ray_ml.serve_rollback_dag import serve_rollback_dag

    serve_rollback_dag()

The page finds the DAG by ``[ray_ml] serve_action_dag_id`` (default ``ray_serve_rollback``); a
team that sets another id there passes the same id here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_ray_ml.serve_apps import APP_NAME
from airflow_ray_ml.ray_serve_rollback import VERSION, RayServeRollbackOperator

DEFAULT_DAG_ID = "ray_serve_rollback"

# The DAG's page in Airflow's UI.
DAG_DOC = """\
Serve an earlier model of a Ray Serve application again: roll back, or pin a version.

The "Ray ML" page starts this DAG when a person clicks "Roll back" or "Pin" (only people Airflow
lets trigger it, and the DAG that owns the application, can); it can also be triggered from the
UI or the REST API with the Params below. A rollback serves the model promoted before the live
one; a pin serves the version named. Each run restores the application's config as that model's
promotion applied it, checks the endpoint answers with that version, and records the decision in
the application's serving history and as the task's note.
"""


def serve_rollback_dag(dag_id: str = DEFAULT_DAG_ID) -> DAG:
    """Define the rollback DAG in the DAG file that calls this; return it.

    Airflow registers a DAG defined while it parses a file under that file, so the call alone
    enables it; the returned DAG may also be kept in a module-level name.

    :param dag_id: the DAG's id; the page triggers the one named by ``[ray_ml] serve_action_dag_id``.
    """
    with DAG(
        dag_id=dag_id,
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
        doc_md=DAG_DOC,
    ) as dag:
        RayServeRollbackOperator(
            task_id="serve_again",
            app_name="{{ params.app_name }}",
            version="{{ params.version }}",
            reason="{{ params.reason }}",
            doc_md="Serve the previous model, or the version given, on the application.",
        )
    return dag
