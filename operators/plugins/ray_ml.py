"""The "Ray ML" page of the Airflow UI: the served models and their history, Tune runs, Ray jobs.

A FastAPI app that Airflow's api-server mounts under ``/ray-ml`` (see ``RayMLPlugin``) and the UI
shows through an external view. It reads

- the served applications from Ray Serve's REST API through :class:`RayHook` (connection
  ``[ray_ml] ray_conn_id``, env ``AIRFLOW__RAY_ML__RAY_CONN_ID``, default ``ray_default``): each
  application's model version and directory from its ``user_config`` (what
  ``RayServeDeployOperator`` writes), the model card's test metrics, replicas and endpoint, and its
  version history from the serving history (``ray_ml_serving``);
- the Tune runs (successful ones and failed ones with their error) of the DAGs the logged-in user
  may read, and the Ray jobs of the selected run's
  DAG run, from Airflow's metadata database (``ray_ml_runs``); the leaderboard and plot through
  ``airflow_ray_ml_stages.artifacts`` (local, s3://, gs://); a job's status and log from Ray's Jobs
  API, on the server, so nobody needs the dashboard's token to read them.

Which DAGs a user may read is asked of Airflow's configured auth manager on every request, so the
page shows the same DAGs as the rest of the UI. Serve applications and their histories are
cluster-wide and shown to every logged-in user. Rolling back or pinning a version triggers a DAG
run (``serve_actions``), which Airflow's permissions govern.

Whatever cannot be read (Ray down, no Tune run yet, a missing file) becomes a sentence on the page;
the page itself always renders. Everything shown is escaped by the templates (autoescape).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Body, Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.security import HTTPBearer
from jinja2 import Environment, FileSystemLoader, select_autoescape

from airflow.plugins_manager import AirflowPlugin

from airflow_ray_ml.links.ray import PAGE_URL_PREFIX
from airflow_ray_ml.plugins import decision_notes
from airflow_ray_ml.plugins.known_params import RefuseUnknownConf
from airflow_ray_ml.plugins.ray_ml_runs import (
    LEADERBOARD_KEY,
    DriftRun,
    SelectorError,
    StageJob,
    TuneRun,
    TuneRunRef,
    find_stage_job,
    list_drift_runs,
    list_tune_runs,
    load_tune_run,
    parse_selector,
    read_leaderboard,
    readable_dag_ids,
    mark_pending,
    stage_jobs,
    valid_submission_id,
)
from airflow_ray_ml.plugins.ray_ml_serving import ServingHistory, artifact_root, read_history, read_trial
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TASK_METRICS
from airflow_ray_ml_stages.model_card import ModelCard

log = logging.getLogger(__name__)

URL_PREFIX = PAGE_URL_PREFIX
CONFIG_SECTION = "ray_ml"
DEFAULT_CONN_ID = "ray_default"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_PLOT_BYTES = 20 * 1024 * 1024
# Every task's metrics, in order: the page shows the ones its models and trials have.
CARD_METRICS = tuple(name for metrics in TASK_METRICS.values() for name in metrics)
METRIC_COLUMNS = tuple(f"val_{name}" for name in CARD_METRICS)
LOG_TAIL_LINES = 200
# A header a cross-site form cannot send (a cross-origin fetch with it needs a CORS preflight,
# which Airflow passes only for origins in [api] access_control_allow_origins), so a state-changing
# POST comes from the page's own script.
ACTION_HEADER = "X-Ray-ML-Action"
DASHBOARD_TOKEN_HELP = (
    "The Ray dashboard asks for the cluster's auth token: it is in ~/.ray/auth_token on the Ray head "
    "node, and it is the auth_token of the Ray connection in Airflow (ask whoever runs the cluster). "
    "Job status and logs on this page are read by Airflow and need no token."
)

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
    history: ServingHistory | None = None
    # the live trial its config carries ({"mode", "share", "challenger_version"}), and what it has seen so far
    rollout: dict[str, Any] | None = None
    trial: str = ""
    # the drift reports of the files its models (this one and those its history served) scored
    drift: list[DriftRun] = field(default_factory=list)


@dataclass
class PageData:
    conn_id: str
    dashboard_url: str | None = None
    internal_dashboard_url: str | None = None
    apps: list[ServedApp] = field(default_factory=list)
    serve_error: str | None = None
    # the Tune runs the user may read, newest first, and the one shown
    tune_runs: list[TuneRunRef] = field(default_factory=list)
    tune: TuneRun | None = None
    tune_error: str | None = None
    # a selector that is malformed (400) or names no run the user may read (404)
    selection_error: str | None = None
    selection_status: int = 200
    # the Ray jobs of the shown Tune run's DAG run
    jobs: list[StageJob] = field(default_factory=list)
    jobs_error: str | None = None
    readable: set[str] = field(default_factory=set)


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
        rollout=user_config.get("rollout") if isinstance(user_config.get("rollout"), dict) else None,
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
        hook = RayHook(data.conn_id, timeout_s=5.0, retries=0)
        data.internal_dashboard_url = hook.dashboard_url
        data.dashboard_url = public_dashboard or hook.dashboard_url
        state = hook.get_serve_applications()
        serve_url = public_serve or hook.serve_url
    except Exception as err:  # unreachable, bad token, bad connection: say so, keep rendering
        data.serve_error = str(err)
        return
    applications = state.get("applications") or {}
    data.apps = [_served_app(name, app, serve_url, data.dashboard_url) for name, app in sorted(applications.items())]
    load_histories(data)


def load_histories(data: PageData) -> None:
    """Each live application's version history (a sentence in it when the history cannot be read)."""
    try:
        root = artifact_root(data.conn_id)
    except Exception as err:
        for served in data.apps:
            served.history = ServingHistory(uri="", error=f"the serving history's location is unknown: {err}")
        return
    for served in data.apps:
        served.history = read_history(root, served.name)
        if served.rollout:
            served.trial = read_trial(root, served.name, served.rollout)


def public_job_url(data: PageData, job_url: str | None) -> str | None:
    """A dashboard link as a person's browser reaches it (``[ray_ml] dashboard_url``)."""
    internal = data.internal_dashboard_url
    if job_url and internal and data.dashboard_url and job_url.startswith(internal):
        return data.dashboard_url + job_url[len(internal):]
    return job_url


# -- Tune runs and their Ray jobs -----------------------------------------------------------------


def load_tune(data: PageData, user: Any, selector: str | None = None) -> None:
    """Fill in the Tune runs ``user`` may read and the selected one (default: the newest).

    A malformed selector, or one naming a run that does not exist or whose DAG the user may not
    read (the two look the same), leaves ``selection_error`` and ``selection_status`` set.
    """
    from airflow.utils.session import create_session

    wanted: TuneRunRef | None = None
    if selector:
        try:
            wanted = parse_selector(selector)
        except SelectorError as err:
            data.selection_error, data.selection_status = str(err), 400
            return
    try:
        with create_session() as session:
            data.readable = readable_dag_ids(user)
            data.tune_runs = list_tune_runs(session, data.readable)
            if wanted is None and data.tune_runs:
                wanted = data.tune_runs[0]
            if wanted is not None:
                data.tune = load_tune_run(session, data.readable, wanted)
                if data.tune is not None:
                    data.jobs = stage_jobs(session, data.tune.dag_id, data.tune.run_id)
    except Exception as err:
        data.tune_error = f"cannot read Airflow's metadata database: {err}"
        return
    if wanted is not None and data.tune is None:
        data.selection_error = (f"No Tune run {wanted.selector!r} among the DAGs you may read; "
                                "pick one from the list.")
        data.selection_status = 404
        return
    if data.tune is None:
        return
    data.tune.job_url = public_job_url(data, data.tune.job_url)
    if data.tune.error is not None:  # a failed run has its error to show, no leaderboard
        return
    try:
        artifact_root(data.conn_id)  # the artifact root's storage credentials, before its first read
        data.tune.rows = read_leaderboard(data.tune.result[LEADERBOARD_KEY])
    except Exception as err:
        data.tune.leaderboard_error = str(err)


DRIFT_RUNS_PER_APP = 10


def load_drift(data: PageData, user: Any) -> None:
    """Each application's drift reports: the scoring runs (of DAGs ``user`` may read) whose model is
    one the application serves or served, newest first."""
    if not data.apps:
        return
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            runs = list_drift_runs(session, data.readable or readable_dag_ids(user))
    except Exception as err:  # the page renders without them; the reason is logged
        log.warning("Cannot read the drift reports: %s", err)
        return
    for served in data.apps:
        entries = served.history.entries if served.history else []
        versions = {served.version, *(entry.served_version for entry in entries)} - {None, ""}
        served.drift = [run for run in runs if run.model_version in versions][:DRIFT_RUNS_PER_APP]


def load_job_statuses(data: PageData) -> None:
    """What Ray says of each stage job now; the first failure to reach Ray ends the lookups."""
    from airflow_ray_ml.hooks.ray import RayHook

    if not data.jobs:
        return
    try:
        hook = RayHook(data.conn_id, timeout_s=5.0, retries=0)
        for job in data.jobs:
            info = hook.get_job_info(job.submission_id)
            job.status = None if info is None else str(info.get("status"))
            job.message = "" if info is None else str(info.get("message") or "")
            mark_pending(job, hook.artifact_root)
            job.job_url = public_job_url(data, job.job_url)
    except Exception as err:
        data.jobs_error = f"Ray cannot be asked about these jobs right now: {err}"


def collect(user: Any, selector: str | None = None, conn_id: str | None = None) -> PageData:
    """What the page shows to ``user``: every Serve application, the Tune runs of DAGs they may read."""
    data = PageData(conn_id=conn_id or ray_conn_id())
    load_serve(data)
    load_tune(data, user, selector)
    load_drift(data, user)
    load_job_statuses(data)
    return data


# -- rendering ----------------------------------------------------------------------------------


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


def _trial_config(config: Any) -> str:
    """A leaderboard row's config: an ensemble's by its members (each trial once, a cross-validated one's fold
    models summed: twenty members' configs and paths would fill the page), any other as compact JSON."""
    members = config.get("members") if isinstance(config, dict) else None
    if isinstance(members, list) and all(isinstance(member, dict) and "weight" in member for member in members):
        from airflow_ray_ml_stages.ensemble import describe_members

        return describe_members(members)
    return _compact(config)


_TEMPLATES.filters["number"] = _number
_TEMPLATES.filters["compact"] = _compact
_TEMPLATES.filters["trial_config"] = _trial_config


def render(data: PageData) -> str:
    rows = data.tune.rows if data.tune else []
    trial_metrics = {name for row in rows for name in (row.get("metrics") or {})}
    served_metrics = {name for app in data.apps for name in app.test_metrics}
    return _TEMPLATES.get_template("ray_ml.html").render(
        data=data, token_help=DASHBOARD_TOKEN_HELP,
        # the columns of the tasks shown (the regression ones when there is nothing yet)
        metric_columns=[name for name in METRIC_COLUMNS if name in trial_metrics]
        or [f"val_{name}" for name in TASK_METRICS["regression"]],
        card_metrics=[name for name in CARD_METRICS if name in served_metrics] or list(TASK_METRICS["regression"]),
    )


def status_json(data: PageData) -> dict[str, Any]:
    tune = data.tune
    return {
        "conn_id": data.conn_id,
        "dashboard_url": data.dashboard_url,
        "serve_error": data.serve_error,
        "applications": [asdict(served) for served in data.apps],
        "tune_error": data.tune_error,
        "selection_error": data.selection_error,
        "tune_runs": [{**asdict(ref), "selector": ref.selector} for ref in data.tune_runs],
        "tune": None if tune is None else {
            "selector": tune.selector, "dag_id": tune.dag_id, "run_id": tune.run_id, "task_id": tune.task_id,
            "map_index": tune.map_index, "job_url": tune.job_url, "result": tune.result, "rows": len(tune.rows),
            "leaderboard_error": tune.leaderboard_error, "error": tune.error, "fix": tune.fix,
        },
        "jobs": [asdict(job) for job in data.jobs],
        "jobs_error": data.jobs_error,
    }


def plot_bytes(user: Any, selector: str | None = None) -> bytes:
    """The plot of the selected (default: newest) Tune run ``user`` may see, checked to be a PNG of sensible size."""
    data = PageData(conn_id=ray_conn_id())
    load_tune(data, user, selector)
    if data.selection_error:
        raise HTTPException(status_code=data.selection_status, detail=data.selection_error)
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


def job_detail(user: Any, submission_id: str, conn_id: str | None = None) -> tuple[StageJob, dict[str, Any]]:
    """A stage job of a DAG ``user`` may read, with Ray's status and the tail of its log.

    404 unless a ``ray_job`` XCom of such a DAG names the job, so the route cannot be used to read
    any job on the cluster. Ray unreachable: the job with ``error`` set, not an error of the route.
    """
    from airflow.utils.session import create_session

    from airflow_ray_ml.hooks.ray import RayHook

    if not valid_submission_id(submission_id):
        raise HTTPException(status_code=400, detail=f"not a Ray job submission id: {submission_id[:200]!r}")
    with create_session() as session:
        job = find_stage_job(session, readable_dag_ids(user), submission_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no stage job {submission_id!r} among the DAGs you may read")
    data = PageData(conn_id=conn_id or ray_conn_id())
    detail: dict[str, Any] = {"info": None, "log_tail": "", "log_lines": 0, "error": None, "dashboard_url": None}
    try:
        hook = RayHook(data.conn_id, timeout_s=10.0, retries=0)
        data.internal_dashboard_url = hook.dashboard_url
        data.dashboard_url = public_urls()[0] or hook.dashboard_url
        detail["dashboard_url"] = data.dashboard_url
        info = hook.get_job_info(submission_id)
        if info is None:
            detail["error"] = "Ray no longer knows this job (the cluster was restarted or the job was deleted)."
        else:
            lines = hook.get_job_logs(submission_id).splitlines()
            detail.update(info=info, log_lines=len(lines), log_tail="\n".join(lines[-LOG_TAIL_LINES:]))
            job.status = str(info.get("status"))
            job.message = str(info.get("message") or "")
            mark_pending(job, hook.artifact_root)
    except Exception as err:
        detail["error"] = f"Ray cannot be asked about this job right now: {err}"
    job.job_url = public_job_url(data, job.job_url)
    return job, detail


# -- routes -------------------------------------------------------------------------------------


_BEARER = HTTPBearer(auto_error=False)


async def require_airflow_user(request: Request) -> Any:
    """Airflow's own login check (``get_user``: a bearer token, else the UI's session cookie).

    Imported on the first request, not with the plugin: every Airflow process loads plugins, and
    the api-server's security module costs seconds to import in a task's process.
    """
    from airflow.api_fastapi.core_api.security import get_user

    # positional: Airflow 3.3 renamed the OAuth argument (oauth_token -> _oauth_token); neither is used here
    return await get_user(request, None, await _BEARER(request))


def serve_action(user: Any, app_name: str, body: Any, action_header: str | None) -> JSONResponse:
    """Roll back (``{"version": null}``) or pin a version of ``app_name`` by triggering a DAG run."""
    if action_header != "1":
        return JSONResponse({"detail": f"send the {ACTION_HEADER}: 1 header (the page's buttons do)"},
                            status_code=403)
    if not isinstance(body, dict) or set(body) - {"version"} or not isinstance(body.get("version"), (str, type(None))):
        return JSONResponse({"detail": 'send JSON {"version": null} to roll back, or {"version": "<model version>"} '
                                       "to pin that version"}, status_code=400)
    # Imported on the first action: it brings the Serve operators, which a page view does not need.
    from airflow_ray_ml.plugins.serve_actions import ServeActionError, request_serve_action

    try:
        run = request_serve_action(user, app_name, body.get("version"))
    except ServeActionError as err:
        return JSONResponse({"detail": str(err)}, status_code=err.status_code)
    return JSONResponse({**run, "url": f"../dags/{run['dag_id']}/runs/{run['run_id']}"}, status_code=201)


def build_app() -> FastAPI:
    """The page's FastAPI app: every route needs an Airflow login and shows what that user may read.

    Plugin apps are not behind Airflow's authentication by themselves, so every route depends on
    Airflow's ``get_user`` (the UI's session cookie reaches the page's iframe, which is on the same
    origin); the user it returns is the auth manager's own user object, which the auth manager is
    then asked about each DAG.
    """
    app = FastAPI(title="Ray ML", dependencies=[Depends(require_airflow_user)], docs_url=None, redoc_url=None,
                  openapi_url=None)
    no_store = {"Cache-Control": "no-store"}

    @app.get("/", response_class=HTMLResponse)
    def page(tune: str | None = None, user: Any = Depends(require_airflow_user)) -> HTMLResponse:
        data = collect(user, tune)
        return HTMLResponse(render(data), status_code=data.selection_status, headers=no_store)

    @app.get("/plot.png")
    def plot(tune: str | None = None, user: Any = Depends(require_airflow_user)) -> Response:
        return Response(plot_bytes(user, tune), media_type="image/png", headers=no_store)

    @app.get("/status.json")
    def status(tune: str | None = None, user: Any = Depends(require_airflow_user)) -> JSONResponse:
        data = collect(user, tune)
        return JSONResponse(status_json(data), status_code=data.selection_status, headers=no_store)

    @app.get("/jobs/{submission_id}", response_class=HTMLResponse)
    def job(submission_id: str, user: Any = Depends(require_airflow_user)) -> HTMLResponse:
        stage_job, detail = job_detail(user, submission_id)
        html = _TEMPLATES.get_template("ray_ml_job.html").render(job=stage_job, detail=detail,
                                                                 token_help=DASHBOARD_TOKEN_HELP)
        return HTMLResponse(html, headers=no_store)

    @app.post("/apps/{app_name}/actions")
    def action(app_name: str, body: Any = Body(None), x_ray_ml_action: str | None = Header(None),
               user: Any = Depends(require_airflow_user)) -> JSONResponse:
        return serve_action(user, app_name, body, x_ray_ml_action)

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
    # Loaded wherever Airflow loads plugins; the scheduler (and dag.test()) call it as runs finish.
    listeners = [decision_notes]
    # The api-server refuses a trigger's conf keys that are not Params of the DAG (known_params).
    fastapi_root_middlewares = [{"middleware": RefuseUnknownConf, "name": "ray_ml: refuse unknown conf keys"}]
