"""A run's conf may hold only the DAG's Params: the api-server refuses any other key at trigger.

Airflow merges a run's conf over the DAG's Params and checks each Param's value, but a key that
is no Param passes without a word, and the run ignores it (``{"batch_size": 0}`` on the wine
pipeline ran with its defaults). For a DAG that declares Params and runs this provider's
operators, the api-server's ``POST /api/v2/dags/{dag_id}/dagRuns`` (the REST API, and the UI's
trigger form, which sends the same request) answers 400 naming the unknown keys and the DAG's
Params, and creates no run. DAGs without Params, or without this provider's operators, are left
as Airflow treats them. ``[ray_ml] refuse_unknown_conf = False`` turns the check off.

Runs that tasks trigger (``TriggerDagRunOperator``, a drift-started retraining) go through the
execution API, not this route, and are not checked here.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import unquote

log = logging.getLogger(__name__)

# The route that creates a run, under any base path the api-server is mounted at.
TRIGGER_ROUTE = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
SETTING_SECTION, SETTING = "ray_ml", "refuse_unknown_conf"


def unknown_conf_keys(conf: Any, params: Any) -> list[str]:
    """The keys of ``conf`` that are not among ``params`` (sorted); none when conf is not a mapping."""
    if not isinstance(conf, dict):
        return []
    return sorted(str(key) for key in conf if key not in params)


def refusal(dag_id: str, unknown: list[str], params: Any) -> str:
    """What the 400 says: which keys, why, what the DAG takes."""
    return (f"conf key(s) {unknown} are not Params of DAG {dag_id!r}, so the run would ignore them; remove or "
            f"rename them. Its Params: {sorted(params)}")


def _runs_this_provider(dag: Any) -> bool:
    """Whether a serialized DAG has a task of this provider's operators (their module is kept)."""
    for task in getattr(dag, "tasks", None) or []:
        module = getattr(task, "_task_module", None) or type(task).__module__
        if str(module).startswith("airflow_ray_ml."):
            return True
    return False


def _check(dag_id: str, body: bytes) -> str | None:
    """The refusal for a trigger of ``dag_id`` with ``body``, or None to let Airflow handle it."""
    from airflow.configuration import conf as airflow_conf

    if not airflow_conf.getboolean(SETTING_SECTION, SETTING, fallback=True):
        return None
    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return None  # Airflow answers a malformed body itself
    conf = payload.get("conf") if isinstance(payload, dict) else None
    if not conf or not isinstance(conf, dict):
        return None
    from airflow.models.serialized_dag import SerializedDagModel

    dag = SerializedDagModel.get_dag(dag_id)
    params = getattr(dag, "params", None)
    if dag is None or not params or not _runs_this_provider(dag):
        return None
    unknown = unknown_conf_keys(conf, params)
    return refusal(dag_id, unknown, params) if unknown else None


class RefuseUnknownConf:
    """ASGI middleware of the api-server: reads a trigger's body, answers 400 when :func:`_check`
    refuses it, and otherwise hands the same body on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        match = TRIGGER_ROUTE.search(scope.get("path", "")) if scope.get("type") == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message.get("type") != "http.request" or not message.get("more_body"):
                break
        from anyio import to_thread

        try:
            refused = await to_thread.run_sync(_check, unquote(match["dag_id"]), body)
        except Exception as err:  # a check that cannot run never blocks a trigger Airflow would take
            log.warning("Could not check the conf keys of a trigger of %s: %s", match["dag_id"], err)
            refused = None
        if refused:
            payload = json.dumps({"detail": refused}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
