"""ServeApplicationOperator: what every operator that changes one Serve application shares.

The connection and the application's API key, its endpoint (every call through :class:`RayHook`),
its serving directory and history, the config it PUTs with the other applications kept, and the
wait until a version answers. ``RayServeDeployOperator`` and ``RayServeRollbackOperator`` build on it.
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_ray_ml.contract import coerce_value
from airflow_ray_ml.errors import (
    InvalidSpecError, RayOperatorError, ServeDeployError, ServeModelRejectedError, ServeUnreachableError,
)
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_apps import APP_NAME
from airflow_ray_ml.serve_config import config_with_app, start_settings
from airflow_ray_ml.serve_history import DECISION_XCOM_KEY, append_history, serving_dir

if TYPE_CHECKING:
    from airflow.sdk import Context

# How often the readiness wait asks, and how many answers in a row must report the new version.
READY_POLL_S = 0.5
READY_STREAK = 3


class ServeApplicationOperator(BaseOperator):
    """What every operator that changes one Serve application shares: the connection, the
    application's serving directory and history, its endpoint, and the config it PUTs.

    :param app_name: the Serve application: letters, digits, ``.``, ``_``, ``-``; None only where the
        subclass derives it before use. (templated)
    :param api_key_conn_id: a connection whose password is the endpoint's API key; none: no key.
    :param ready_timeout_s: how long a new version may take to answer.
    :param ray_conn_id: the ``ray_ml`` connection.
    :param artifact_root: where the serving history lives; None: the connection's ``artifact_root``.
    """

    def __init__(
        self,
        *,
        app_name: str | None,
        api_key_conn_id: str | None = None,
        ready_timeout_s: float = 180.0,
        ray_conn_id: str = RayHook.default_conn_name,
        artifact_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("multiple_outputs", True)  # task.output["key"], as the stage operators
        super().__init__(**kwargs)
        self.app_name = app_name
        self.route_prefix = ""
        self.api_key_conn_id = api_key_conn_id
        self.ready_timeout_s = ready_timeout_s
        self.ray_conn_id = ray_conn_id
        self.artifact_root = artifact_root

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id)

    @cached_property
    def api_key(self) -> str | None:
        if not self.api_key_conn_id:
            return None
        from airflow.sdk import BaseHook

        key = BaseHook.get_connection(self.api_key_conn_id).password
        if not key:
            raise RayOperatorError(f"connection {self.api_key_conn_id!r} has no password to use as the API key")
        return key

    @property
    def endpoint(self) -> str:
        return self.hook.endpoint_url(self.route_prefix)

    @property
    def serving_dir(self) -> str:
        return serving_dir(self.artifact_root or self.hook.artifact_root, self.app_name)

    def check_app_name(self) -> None:
        """The application name as Serve and the serving history's path accept it."""
        if coerce_value(self.app_name, str | None, f"{self.task_id}.app_name") is None:
            raise InvalidSpecError(f"task {self.task_id!r}: app_name is required: the Serve application to change "
                                   f"(pass app_name=, or the Param it renders); got {self.app_name!r}")
        if not isinstance(self.app_name, str) or not APP_NAME.fullmatch(self.app_name):
            raise InvalidSpecError(f"app_name must be letters, digits, '.', '_' or '-' (starting with a letter or "
                                   f"digit), got {self.app_name!r}")

    # -- the config ------------------------------------------------------------------------------

    def serve_state(self) -> dict[str, Any]:
        return self.hook.get_serve_applications()

    def live_app(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """This application's entry in Serve's state; None when it is not live."""
        return (state.get("applications") or {}).get(self.app_name)

    def start_settings(self) -> dict[str, Any]:
        """The instance settings a deploy starts Serve with, HTTP on the connection's ``serve_url`` port."""
        return start_settings(self.hook.serve_url)

    def with_app(self, instance: dict[str, Any], applications: list[dict[str, Any]],
                 ours: dict[str, Any] | None) -> dict[str, Any]:
        """The whole config to PUT: ``instance`` settings, the other applications as given, and ``ours``."""
        return config_with_app(instance, applications, self.app_name, ours)

    # -- waiting ---------------------------------------------------------------------------------

    def wait_for_version(self, version: str, deadline: float) -> None:
        """Until the app is RUNNING and ``READY_STREAK`` answers in a row report ``version``."""
        streak, last = 0, "no answer yet"
        while time.monotonic() < deadline:
            app = self.live_app(self.serve_state()) or {}
            status = app.get("status")
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise ServeModelRejectedError(f"application {self.app_name!r} is {status}: "
                                              f"{app.get('message', '')[-800:]}")
            response = None
            if status == "RUNNING":
                try:
                    response = self.hook.get_endpoint_health(self.route_prefix, api_key=self.api_key)
                except ServeUnreachableError:  # the HTTP proxy may still be starting
                    pass
            if response is not None and response.status_code == 200 and response.json().get("model_version") == version:
                streak += 1
                if streak >= READY_STREAK:
                    return
            else:
                streak = 0
                last = f"status {status}, health {getattr(response, 'status_code', None)}"
            time.sleep(READY_POLL_S)
        raise ServeDeployError(f"version {version} did not become ready within {self.ready_timeout_s:g} s ({last})")

    # -- history --------------------------------------------------------------------------------

    def record(self, context: Context, entry: dict[str, Any]) -> None:
        """Append ``entry`` (with who decided and when) to the application's serving history, and
        push it as the task's ``decision`` XCom, which becomes the task's and the run's note."""
        ti = context["ti"]
        append_history(self.serving_dir, {"dag_id": ti.dag_id, "run_id": context["run_id"], "task_id": self.task_id,
                                          **entry})
        ti.xcom_push(key=DECISION_XCOM_KEY, value=entry)
