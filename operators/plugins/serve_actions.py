"""Roll back or pin a served model from the "Ray ML" page, as a run of the rollback DAG.

The page does not change Ray Serve itself: it triggers a run of the DAG named by
``[ray_ml] serve_action_dag_id`` (default ``ray_serve_rollback``, which ``serve_rollback_dag()`` defines),
whose ``RayServeRollbackOperator`` does the work, so a rollback is logged, permissioned and retried
like any other work. Before triggering, it checks what the run would find out too late:

- the user may trigger the rollback DAG, and the DAG that owns the application (the one recorded
  in the live config by its deploy), as Airflow's auth manager says;
- the version can be served: a pinned version has a recorded config, and a rollback has a model
  promoted before the live one.
"""

from __future__ import annotations

from typing import Any

from airflow_ray_ml.serve_apps import APP_NAME, app_model_version, app_owner
from airflow_ray_ml.serve_history import config_uri, read_history, serving_dir
from airflow_ray_ml.ray_serve_rollback import RollbackError, check_version, previous_version, promoted_versions
from airflow_ray_ml.serve_rollback_dag import DEFAULT_DAG_ID
from airflow_ray_ml_stages import artifacts


class ServeActionError(Exception):
    """A rollback or pin the page refuses, with the HTTP status to answer and what to do."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def serve_action_dag_id() -> str:
    """The DAG that rollbacks and pins run as: ``[ray_ml] serve_action_dag_id``, else ``ray_serve_rollback``."""
    from airflow.configuration import conf

    from airflow_ray_ml.plugins.ray_ml import CONFIG_SECTION

    return conf.get(CONFIG_SECTION, "serve_action_dag_id", fallback=None) or DEFAULT_DAG_ID


def _may_trigger(user: Any, dag_id: str) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                details=DagDetails(id=dag_id), user=user)


def _not_allowed(dag_id: str, app_name: str) -> str:
    return (f"you may not trigger DAG {dag_id!r}, which a rollback or pin of {app_name!r} needs; ask an Airflow "
            "admin for that DAG's run permission")


def check_servable(hook: Any, app_name: str, version: str | None) -> tuple[str, str | None, str | None]:
    """(the version the run would serve, the live version, the owning DAG), or a ServeActionError."""
    live_app = (hook.get_serve_applications().get("applications") or {}).get(app_name)
    live_config = (live_app or {}).get("deployed_app_config")
    live, owner = app_model_version(live_config), app_owner(live_config)
    app_dir = serving_dir(hook.artifact_root, app_name)
    history = read_history(app_dir)
    try:
        if version is None:
            return previous_version(history, live), live, owner
    except RollbackError as err:
        raise ServeActionError(409, f"cannot roll back {app_name!r}: {err}") from None
    if not artifacts.exists(config_uri(app_dir, version)):
        known = promoted_versions(history)[::-1]
        raise ServeActionError(404, f"version {version!r} was never promoted to {app_name!r}, so there is no "
                                    f"config to serve it with; promoted versions: {known or 'none'}")
    return version, live, owner


def request_serve_action(user: Any, app_name: str, version: str | None, conn_id: str | None = None) -> dict[str, Any]:
    """Trigger the rollback DAG for ``app_name``: back to the previous model (``version=None``) or ``version``.

    :param conn_id: the ``ray_ml`` connection; None: the page's (``[ray_ml] ray_conn_id``).
    :return: ``{"dag_id", "run_id", "version", "from_version"}`` of the triggered run.
    :raises ServeActionError: 400 bad input, 403 not allowed, 404 unknown DAG or version, 409 nothing to roll back to.
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.models.dag import DagModel
    from airflow.utils.types import DagRunTriggeredByType

    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.plugins.ray_ml import ray_conn_id

    if not isinstance(app_name, str) or not APP_NAME.fullmatch(app_name):
        raise ServeActionError(400, f"not a Serve application name: {app_name!r}")
    try:
        version = check_version(version)
    except RollbackError as err:
        raise ServeActionError(400, str(err)) from None
    dag_id = serve_action_dag_id()
    if DagModel.get_current(dag_id) is None:
        raise ServeActionError(404, f"DAG {dag_id!r} is not in Airflow: add a file to your DAGs folder that calls "
                                    f"airflow_ray_ml.serve_rollback_dag.serve_rollback_dag({dag_id!r}), or set "
                                    "[ray_ml] serve_action_dag_id to the DAG that rolls back")
    if not _may_trigger(user, dag_id):  # before Ray is asked anything
        raise ServeActionError(403, _not_allowed(dag_id, app_name))
    try:
        target, live, owner = check_servable(RayHook(conn_id or ray_conn_id(), timeout_s=10.0, retries=0), app_name, version)
    except ServeActionError:
        raise
    except Exception as err:  # Ray unreachable, bad token, unreadable history: say so
        raise ServeActionError(502, f"cannot read {app_name!r} from Ray Serve: {err}") from None
    if owner and owner != dag_id and not _may_trigger(user, owner):
        raise ServeActionError(403, _not_allowed(owner, app_name))
    who = user.get_name()
    what = f"pin {target}" if version else f"roll back from {live} to {target}"
    run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=who,
                      conf={"app_name": app_name, "version": version, "reason": f"asked by {who} on the Ray ML page"},
                      note=f"{app_name}: {what} (asked by {who} on the Ray ML page)")
    return {"dag_id": dag_id, "run_id": run.run_id, "version": target, "from_version": live}
