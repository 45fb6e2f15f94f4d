"""The "Ray ML" page of the Airflow UI: served models, the last Tune leaderboard, Ray dashboard links.

A FastAPI app that Airflow's api-server mounts under ``/ray-ml`` (see ``RayMLPlugin``) and the UI
shows through an external view. It reads

- the served applications from Ray Serve's REST API through :class:`RayHook` (connection
  ``[ray_ml] ray_conn_id``, env ``AIRFLOW__RAY_ML__RAY_CONN_ID``, default ``ray_default``): each
  application's model version and directory from its ``user_config`` (what
  ``RayServeDeployOperator`` writes), the model card's test metrics, replicas and endpoint;
- the last Tune run from Airflow's metadata database: the newest ``leaderboard_json_uri`` XCom
  (the RayTune operator pushes each manifest key as an XCom of its own) of a successful task in a
  DAG the logged-in user may read, then the leaderboard JSON and plot it points at, through
  ``airflow_ray_ml_stages.artifacts`` (local, s3://, gs://).

Which DAGs a user may read is asked of Airflow's configured auth manager on every request, so the
page shows the same DAGs as the rest of the UI. Serve applications are cluster-wide and shown to
every logged-in user.

Whatever cannot be read (Ray down, no Tune run yet, a missing file) becomes a sentence on the page;
the page itself always renders. Everything shown is escaped by the template (autoescape).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPBearer
from jinja2 import Environment, FileSystemLoader, select_autoescape

from airflow.plugins_manager import AirflowPlugin

from airflow_ray_ml.links.ray import RAY_JOB_XCOM_KEY
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.model_card import ModelCard

log = logging.getLogger(__name__)

URL_PREFIX = "/ray-ml"
CONFIG_SECTION = "ray_ml"
DEFAULT_CONN_ID = "ray_default"
LEADERBOARD_KEY = "leaderboard_json_uri"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_PLOT_BYTES = 20 * 1024 * 1024
METRIC_COLUMNS = ("val_rmse", "val_mae", "val_acc_0_5", "val_acc_1_0")
CARD_METRICS = ("rmse", "mae", "acc_0_5", "acc_1_0")
# Newest leaderboard XComs looked at: another task may push a non-text value under the same key.
CANDIDATE_LIMIT = 20

_TEMPLATES = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _setting(name: str, default: str | None = None) -> str | None:
    from airflow.configuration import conf

    return conf.get(CONFIG_SECTION, name, fallback=default) or default


def ray_conn_id() -> str:
    """The connection the page reads Ray through: ``[ray_ml] ray_conn_id``, else ``ray_default``."""
    return _setting("ray_conn_id", DEFAULT_CONN_ID)


def public_urls() -> tuple[str | None, str | None]:
    """Where a person's browser reaches the dashboard and Serve, when not where Airflow does.

    ``[ray_ml] dashboard_url`` / ``serve_url`` (``AIRFLOW__RAY_ML__DASHBOARD_URL``, ...): for
    example ``http://127.0.0.1:8265`` when Airflow reaches Ray as ``http://ray-head:8265`` inside
    docker compose. Unset: the connection's own URLs are shown.
    """
    dashboard, serve = _setting("dashboard_url"), _setting("serve_url")
    return (dashboard.rstrip("/") if dashboard else None), (serve.rstrip("/") if serve else None)


# -- what the page shows ------------------------------------------------------------------------


@dataclass
class ServedApp:
    name: str
    status: str
    endpoint: str
    version: str | None = None
    model_dir: str | None = None
    family: str | None = None
    trained_at: str | None = None
    test_metrics: dict[str, float] = field(default_factory=dict)
    replicas_running: int = 0
    replicas_target: int | None = None
    message: str = ""
    card_error: str | None = None
    dashboard_link: str = ""


@dataclass
class TuneRun:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    pushed_at: str
    result: dict[str, Any]
    job_url: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    leaderboard_error: str | None = None


@dataclass
class PageData:
    conn_id: str
    dashboard_url: str | None = None
    internal_dashboard_url: str | None = None
    apps: list[ServedApp] = field(default_factory=list)
    serve_error: str | None = None
    tune: TuneRun | None = None
    tune_error: str | None = None


# -- Ray Serve ----------------------------------------------------------------------------------


def _first_deployment(app: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (config, live details) of the deployment that carries the model's ``user_config``."""
    configs = (app.get("deployed_app_config") or {}).get("deployments") or []
    config = next((d for d in configs if isinstance(d.get("user_config"), dict)), configs[0] if configs else {})
    live = (app.get("deployments") or {}).get(config.get("name")) if config else None
    if live is None and app.get("deployments"):
        live = next(iter(app["deployments"].values()))
    return config, live or {}


def _served_app(name: str, app: dict[str, Any], serve_url: str, dashboard_url: str) -> ServedApp:
    config, live = _first_deployment(app)
    user_config = config.get("user_config") or {}
    route = app.get("route_prefix") or (app.get("deployed_app_config") or {}).get("route_prefix") or ""
    replicas = live.get("replicas") or []
    served = ServedApp(
        name=name,
        status=str(app.get("status") or "UNKNOWN"),
        endpoint=f"{serve_url}{route}" if route else "",
        version=user_config.get("model_version"),
        model_dir=user_config.get("model_dir"),
        replicas_running=sum(1 for replica in replicas if replica.get("state") == "RUNNING"),
        replicas_target=live.get("target_num_replicas"),
        message=str(app.get("message") or live.get("message") or ""),
        dashboard_link=f"{dashboard_url}/#/serve/applications/{name}",
    )
    if served.model_dir:
        try:
            card = ModelCard.read(served.model_dir)
        except Exception as err:  # a missing or unreadable card is shown, not raised
            served.card_error = f"model card not readable: {err}"
        else:
            served.family = card.family
            served.trained_at = card.trained_at
            served.version = served.version or card.model_version
            test = card.metrics.get("test") or {}
            served.test_metrics = {k: test[k] for k in CARD_METRICS if isinstance(test.get(k), (int, float))}
    return served


def load_serve(data: PageData) -> None:
    """Fill in the served applications, or the reason they cannot be shown."""
    from airflow_ray_ml.hooks.ray import RayHook

    public_dashboard, public_serve = public_urls()
    try:
        hook = RayHook(data.conn_id, timeout_s=5.0)
        data.internal_dashboard_url = hook.dashboard_url
        data.dashboard_url = public_dashboard or hook.dashboard_url
        state = hook.get_serve_applications()
        serve_url = public_serve or hook.serve_url
    except Exception as err:  # unreachable, bad token, bad connection: say so, keep rendering
        data.serve_error = str(err)
        return
    applications = state.get("applications") or {}
    data.apps = [_served_app(name, app, serve_url, data.dashboard_url) for name, app in sorted(applications.items())]


# -- the last Tune run ----------------------------------------------------------------------------


def _decode(value: Any) -> Any:
    from airflow.models.xcom import XComModel

    try:
        return XComModel.deserialize_value(_Row(value))
    except Exception:
        try:
            return json.loads(value) if isinstance(value, (str, bytes)) else value
        except ValueError:
            return None


@dataclass
class _Row:
    """What ``XComModel.deserialize_value`` reads from a result row."""

    value: Any


def readable_dag_ids(user: Any) -> set[str]:
    """The DAGs ``user`` (the auth manager's user object) may read, as Airflow's auth manager says."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def _xcom_values(session, dag_id: str, run_id: str, task_id: str, map_index: int, keys: tuple[str, ...]
                 ) -> dict[str, Any]:
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    rows = session.execute(
        select(XComModel.key, XComModel.value).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
            XComModel.map_index == map_index, XComModel.key.in_(keys))
    )
    return {key: _decode(value) for key, value in rows}


def find_last_tune(session, dag_ids: set[str]) -> TuneRun | None:
    """The newest successful Tune task in ``dag_ids``: the newest ``leaderboard_json_uri`` XCom.

    The lookup is by XCom key (indexed) and DAG id; no XCom values are scanned. Only for the one
    task found are its manifest (``return_value``) and Ray job record read.
    """
    from sqlalchemy import and_, select

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XCOM_RETURN_KEY, XComModel
    from airflow.utils.state import TaskInstanceState

    if not dag_ids:
        return None
    query = (
        select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index,
               XComModel.timestamp, XComModel.value)
        .join(TaskInstance, and_(TaskInstance.dag_id == XComModel.dag_id,
                                 TaskInstance.run_id == XComModel.run_id,
                                 TaskInstance.task_id == XComModel.task_id,
                                 TaskInstance.map_index == XComModel.map_index))
        .where(XComModel.key == LEADERBOARD_KEY, XComModel.dag_id.in_(sorted(dag_ids)),
               TaskInstance.state == TaskInstanceState.SUCCESS)
        .order_by(XComModel.timestamp.desc())
        .limit(CANDIDATE_LIMIT)
    )
    for dag_id, run_id, task_id, map_index, timestamp, raw in session.execute(query).all():
        uri = _decode(raw)
        if not isinstance(uri, str) or not uri:
            continue
        values = _xcom_values(session, dag_id, run_id, task_id, map_index, (XCOM_RETURN_KEY, RAY_JOB_XCOM_KEY))
        manifest = values.get(XCOM_RETURN_KEY)
        job = values.get(RAY_JOB_XCOM_KEY)
        return TuneRun(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index,
            pushed_at=timestamp.isoformat(timespec="seconds") if isinstance(timestamp, datetime) else str(timestamp),
            result={**(manifest if isinstance(manifest, dict) else {}), LEADERBOARD_KEY: uri},
            job_url=job.get("job_url") if isinstance(job, dict) else None,
        )
    return None


def read_leaderboard(uri: str) -> list[dict[str, Any]]:
    """The leaderboard rows (best first); a clear error when the file is not a list of rows."""
    rows = artifacts.read_json(uri)
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"leaderboard {uri!r} is not a JSON list of rows")
    return rows


def load_tune(data: PageData, user: Any) -> None:
    """Fill in the newest Tune run among the DAGs ``user`` may read, or the reason it cannot be."""
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            data.tune = find_last_tune(session, readable_dag_ids(user))
    except Exception as err:
        data.tune_error = f"cannot read Airflow's metadata database: {err}"
        return
    if data.tune is None:
        return
    job_url, internal = data.tune.job_url, data.internal_dashboard_url
    if job_url and internal and data.dashboard_url and job_url.startswith(internal):
        data.tune.job_url = data.dashboard_url + job_url[len(internal):]
    try:
        data.tune.rows = read_leaderboard(data.tune.result[LEADERBOARD_KEY])
    except Exception as err:
        data.tune.leaderboard_error = str(err)


def collect(user: Any, conn_id: str | None = None) -> PageData:
    """What the page shows to ``user``: every Serve application, the Tune run of a DAG they may read."""
    data = PageData(conn_id=conn_id or ray_conn_id())
    load_serve(data)
    load_tune(data, user)
    return data


# -- rendering ----------------------------------------------------------------------------------


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


_TEMPLATES.filters["number"] = _number
_TEMPLATES.filters["compact"] = _compact


def render(data: PageData) -> str:
    return _TEMPLATES.get_template("ray_ml.html").render(
        data=data, metric_columns=METRIC_COLUMNS, card_metrics=CARD_METRICS
    )


def plot_bytes(user: Any) -> bytes:
    """The plot of the last Tune run ``user`` may see, checked to be a PNG of sensible size."""
    data = PageData(conn_id="")
    load_tune(data, user)
    uri = (data.tune.result.get("plot_uri") if data.tune else None) or None
    if not uri:
        raise HTTPException(status_code=404, detail="no Tune run with a plot yet")
    try:
        payload = artifacts.read_bytes(uri)
    except Exception as err:
        raise HTTPException(status_code=404, detail=f"plot not readable: {err}") from None
    if not payload.startswith(PNG_MAGIC) or len(payload) > MAX_PLOT_BYTES:
        raise HTTPException(status_code=404, detail=f"{uri} is not a PNG image")
    return payload


_BEARER = HTTPBearer(auto_error=False)


async def require_airflow_user(request: Request) -> Any:
    """Airflow's own login check (``get_user``: a bearer token, else the UI's session cookie).

    Imported on the first request, not with the plugin: every Airflow process loads plugins, and
    the api-server's security module costs seconds to import in a task's process.
    """
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, _oauth_token=None, bearer_credentials=await _BEARER(request))


def build_app() -> FastAPI:
    """The page's FastAPI app: every route needs an Airflow login and shows what that user may read.

    Plugin apps are not behind Airflow's authentication by themselves, so every route depends on
    Airflow's ``get_user`` (the UI's session cookie reaches the page's iframe, which is on the same
    origin); the user it returns is the auth manager's own user object, which the auth manager is
    then asked about each DAG.
    """
    app = FastAPI(title="Ray ML", dependencies=[Depends(require_airflow_user)], docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def page(user: Any = Depends(require_airflow_user)) -> HTMLResponse:
        return HTMLResponse(render(collect(user)), headers={"Cache-Control": "no-store"})

    @app.get("/plot.png")
    def plot(user: Any = Depends(require_airflow_user)) -> Response:
        return Response(plot_bytes(user), media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.get("/status.json")
    def status(user: Any = Depends(require_airflow_user)) -> dict[str, Any]:
        data = collect(user)
        return {
            "conn_id": data.conn_id,
            "dashboard_url": data.dashboard_url,
            "serve_error": data.serve_error,
            "applications": [vars(served) for served in data.apps],
            "tune_error": data.tune_error,
            "tune": None if data.tune is None else {
                "dag_id": data.tune.dag_id, "run_id": data.tune.run_id, "task_id": data.tune.task_id,
                "job_url": data.tune.job_url, "result": data.tune.result, "rows": len(data.tune.rows),
                "leaderboard_error": data.tune.leaderboard_error,
            },
        }

    return app


# -- the Airflow plugin ---------------------------------------------------------------------------

class RayMLPlugin(AirflowPlugin):
    """Mounts the page at ``/ray-ml`` in the api-server and adds "Ray ML" to the UI's navigation.

    The task-level links (Ray job, Serve endpoint, Ray Serve) are not registered here: the provider
    entry point (``airflow_ray_ml.get_provider_info``, "extra-links") registers them wherever the
    project is installed, and registering them twice would show each link twice.
    """

    name = "ray_ml"
    fastapi_apps = [{"app": build_app(), "url_prefix": URL_PREFIX, "name": "Ray ML"}]
    # Relative href: the UI resolves it against its base URL, so it works behind a path prefix too.
    external_views = [{"name": "Ray ML", "href": "ray-ml/", "url_route": "ray-ml", "destination": "nav"}]
