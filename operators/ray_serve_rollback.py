"""RayServeRollbackOperator: put an earlier model of a Serve application back, as a task of a DAG run.

A rollback serves again the model that was promoted before the live one; a pin serves a version
named by the caller. Either restores the application's config exactly as its promotion applied
it (``<serving dir>/configs/<version>.json``: route, replicas, owner and all), keeps the other
applications and the Serve instance's settings as they are live, waits until the version answers
on the endpoint, and appends the decision to the serving history. A version that does not come up
in time is replaced by what was live before, and the task fails.

The "Ray ML" page starts these as runs of the ``ray_serve_rollback`` DAG, so a rollback is logged,
permissioned and retried like any other work.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Sequence

from airflow_ray_ml.contract import coerce_value
from airflow_ray_ml.errors import InvalidSpecError, ServeDeployError, ServeModelRejectedError
from airflow_ray_ml.serve_application import ServeApplicationOperator
from airflow_ray_ml.serve_apps import app_model_version
from airflow_ray_ml.serve_config import live_applications, live_instance_settings
from airflow_ray_ml.serve_history import config_uri, read_history
from airflow_ray_ml_stages import artifacts

if TYPE_CHECKING:
    from airflow.sdk import Context

# A model version as train writes it (also a file name under configs/).
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RollbackError(InvalidSpecError):
    """The version asked for cannot be served: none earlier, unknown, or no config recorded for it."""


def promoted_versions(history: list[dict[str, Any]]) -> list[str]:
    """The versions the gate promoted, oldest first, each once (its first promotion)."""
    versions: list[str] = []
    for entry in history:
        version = entry.get("challenger_version")
        if entry.get("action") == "promoted" and isinstance(version, str) and version not in versions:
            versions.append(version)
    return versions


def previous_version(history: list[dict[str, Any]], live_version: str | None) -> str:
    """The model promoted before ``live_version``: what "roll back" serves.

    Walking back the promotions (not the pins) means a second rollback goes one model further
    back, instead of undoing the first.
    """
    versions = promoted_versions(history)
    if not versions:
        raise RollbackError("nothing was ever promoted to this application, so there is no model to roll back to")
    if live_version is None:
        raise RollbackError(f"the application serves no model now; pin one of {versions[::-1]} instead")
    if live_version not in versions:
        raise RollbackError(f"the live version {live_version!r} was not promoted by a deploy of this application; "
                            f"pin one of {versions[::-1]} instead")
    position = versions.index(live_version)
    if position == 0:
        raise RollbackError(f"{live_version} is the first model promoted to this application; there is none "
                            "before it to roll back to")
    return versions[position - 1]


def check_version(version: str | None) -> str | None:
    """``version`` as a model version, None for "the previous one"; a clear error for anything else."""
    if version in (None, ""):
        return None
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        raise RollbackError(f"version must be a model version such as 'xgboost-20260601T120000-ab12cd' (letters, "
                            f"digits, '.', '_', '-'), or empty for the previous model; got {version!r}")
    return version


class RayServeRollbackOperator(ServeApplicationOperator):
    """Serve an earlier model of ``app_name`` again: the previous one, or the ``version`` given.

    :param app_name: the Serve application, as the deploy named it; required: a rollback runs in a DAG
        of its own, so it cannot be derived from the DAG as the deploy's is. (templated)
    :param version: the model version to serve (one that a deploy promoted to this application);
        empty or None: the model promoted before the live one. (templated)
    :param reason: why, in words, kept in the serving history and the task's note. (templated)
    :param ready_timeout_s: how long the version may take to answer.
    :param api_key_conn_id: the endpoint's API key connection, as the deploy's.
    """

    template_fields: Sequence[str] = ("app_name", "version", "reason")
    ui_color = "#fdf3e1"

    def __init__(self, *, app_name: str, version: str | None = None, reason: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app_name=app_name, **kwargs)
        self.version = version
        self.reason = reason

    def _stored_app(self, version: str) -> dict[str, Any]:
        """This application's entry in the config that the promotion of ``version`` applied."""
        uri = config_uri(self.serving_dir, version)
        if not artifacts.exists(uri):
            known = promoted_versions(read_history(self.serving_dir))
            raise RollbackError(f"no config of version {version!r} was recorded for application {self.app_name!r} "
                                f"(at {uri}); versions promoted to it: {known[::-1] or 'none'}")
        config = artifacts.read_json(uri)
        app = next((a for a in config.get("applications") or [] if a.get("name") == self.app_name), None)
        if app is None:
            raise RollbackError(f"{uri} has no application {self.app_name!r}")
        return app

    def execute(self, context: Context) -> dict[str, Any]:
        self.check_app_name()
        version = check_version(coerce_value(self.version, str | None, f"{self.task_id}.version"))
        self.hook.check_access()
        state = self.serve_state()
        live_app = self.live_app(state)
        live_config = (live_app or {}).get("deployed_app_config")
        live_version = app_model_version(live_config)
        action = "pinned" if version else "rollback"
        target = version or previous_version(read_history(self.serving_dir), live_version)
        stored = self._stored_app(target)
        self.route_prefix = stored.get("route_prefix") or ""
        why = self.reason or (f"pinned {target}" if version else f"rolled back from {live_version} to {target}")
        entry = {"action": action, "version": target, "from_version": live_version, "reason": why}
        if target == live_version:
            self.log.info("%s already serves %s; nothing to change", self.app_name, target)
            self.record(context, {**entry, "action": "unchanged", "reason": f"{target} was already served"})
            return {**entry, "action": "unchanged", "endpoint": self.endpoint}

        instance = live_instance_settings(state)
        applications = live_applications(state)
        self.log.info("Serving %s again on %s (%s)", target, self.app_name, why)
        self.hook.put_serve_applications(self.with_app(instance or self.start_settings(), applications, stored))
        try:
            self.wait_for_version(target, time.monotonic() + self.ready_timeout_s)
        except Exception as err:
            self.log.error("%s did not come up (%s); restoring %s", target, err, live_version or "the previous state")
            now = self.serve_state()
            self.hook.put_serve_applications(self.with_app(
                instance if instance is not None else live_instance_settings(now) or {},
                live_applications(now), live_config))
            if live_version:
                self.wait_for_version(live_version, time.monotonic() + self.ready_timeout_s)
            self.record(context, {**entry, "action": "rollback_failed", "error": str(err)})
            error = ServeModelRejectedError if isinstance(err, ServeModelRejectedError) else ServeDeployError
            raise error(f"serving {target} again failed and {live_version or 'the previous state'} was restored: "
                        f"{err}") from None
        self.record(context, entry)
        self.log.info("Serving %s at %s", target, self.endpoint)
        return {**entry, "endpoint": self.endpoint, "model_version": target}
