"""RayServeDeployOperator: promote a trained model to Ray Serve only if it beats the served one.

The operator talks to the Serve REST API (a declarative config, not ``serve.run``): it reads the
live champion's card, gates the challenger on the test metric, applies the new config (a
``user_config`` change, so live replicas ``reconfigure()`` in place), waits until the application
is RUNNING and answers with the new version, smoke-tests the endpoint over HTTP with rows of the
test split, and on any failure restores the previous config and fails with the reason. Every
decision is appended to ``<artifact_root>/serving/<app>/history.json``.

A deploy changes only its own application: the other applications and the Serve instance's own
settings (proxy location, HTTP options, target capacity, ...) are sent back as they are live, unless
``serve_instance_options`` asks otherwise. The application records the DAG that deployed it, and a
deploy from another DAG is refused unless ``allow_takeover=True``.

A champion that cannot score the challenger's rows (other columns, label, classes or task:
``airflow_ray_ml.serve_schema``) is not compared: ``on_schema_change`` decides, and the decision
says what changed.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence
from urllib.parse import urlsplit

import requests
from airflow.sdk import BaseOperator

from airflow_ray_ml.contract import coerce_value, operator_setting
from airflow_ray_ml.errors import (
    InvalidSpecError, RayOperatorError, ServeAppOwnershipError, ServeDeployError, ServeModelRejectedError,
)
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.links.ray import SERVE_XCOM_KEY, RayServeDashboardLink, RayServeEndpointLink
from airflow_ray_ml.serve_schema import (
    DEFAULT_ON_SCHEMA_CHANGE, SCHEMA_CHANGE_POLICIES, ModelSchema, answer_problems, schema_change_reason,
    schema_changes,
)
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import task_of
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, TASK_METRICS, direction, task_metrics

if TYPE_CHECKING:
    from airflow.sdk import Context

APP_IMPORT_PATH = "airflow_ray_ml_stages.serve:build_app"  # kept equal to airflow_ray_ml_stages.serve.APP_IMPORT_PATH by a test
DEPLOYMENT_NAME = "ModelServer"
APP_NAME_MAX_LENGTH = 63
APP_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{APP_NAME_MAX_LENGTH - 1}}}")
ROUTE_PREFIX = re.compile(r"/(?:[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*)?")
# The key of the deployment's user_config that names the DAG owning the application. Serve keeps
# user_config as given and returns it in deployed_app_config; the replicas ignore the key.
OWNER_KEY = "owner_dag_id"
# The instance-wide settings of Serve's declarative config: every top-level key but "applications".
SERVE_INSTANCE_SETTINGS = ("proxy_location", "http_options", "grpc_options", "controller_options",
                           "logging_config", "tracing_config", "target_capacity")
# Serve takes these only when it starts; a running instance keeps its own whatever a config says.
START_ONLY_SETTINGS = frozenset({"proxy_location", "http_options", "grpc_options", "controller_options"})
# What a deploy starts Serve with when it is not running; the HTTP port is the connection's serve_url's.
SERVE_START_DEFAULTS: dict[str, Any] = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1"}}

# The task XCom that holds a deploy's or a rollback's decision (action, versions, metrics, reason).
DECISION_XCOM_KEY = "decision"


def app_name_for_dag(dag_id: str) -> str:
    """The Serve application of a deploy that names none: its DAG's id, made a valid ``APP_NAME``.

    Each run of characters a name may not hold becomes one ``-``, leading ``.``, ``_`` and ``-``
    are dropped (a name starts with a letter or digit), and the rest is cut to
    ``APP_NAME_MAX_LENGTH`` characters: DAG ``"_ventes.prévisions"`` gets ``"ventes.pr-visions"``.
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", dag_id).lstrip("._-")[:APP_NAME_MAX_LENGTH]
    if not APP_NAME.fullmatch(name):
        raise InvalidSpecError(f"no Serve application name can be made from DAG id {dag_id!r} (it needs a letter "
                               "or digit); pass app_name= to RayServeDeployOperator")
    return name


def serving_dir(artifact_root: str | None, app_name: str) -> str:
    """Where an application's serving history, configs and previous config live."""
    if not artifact_root:
        from airflow_ray_ml.ray_job import DEFAULT_ARTIFACT_ROOT

        artifact_root = DEFAULT_ARTIFACT_ROOT
    return artifacts.join(artifact_root, "serving", artifacts.safe_segment(app_name))


def history_uri(app_serving_dir: str) -> str:
    """The application's serving history: a JSON list of decisions, oldest first."""
    return artifacts.join(app_serving_dir, "history.json")


def read_history(app_serving_dir: str) -> list[dict[str, Any]]:
    """The application's serving history (``[]`` before its first decision)."""
    uri = history_uri(app_serving_dir)
    return artifacts.read_json(uri) if artifacts.exists(uri) else []


def config_uri(app_serving_dir: str, version: str) -> str:
    """The whole Serve config that a promotion of ``version`` applied (what a rollback restores)."""
    return artifacts.join(app_serving_dir, "configs", f"{version}.json")


def gate(challenger: float, champion: float | None, metric: str, min_improvement: float, force: bool) -> tuple[bool, str]:
    """Decide promotion: better than the champion by at least ``min_improvement`` (absolute)."""
    if force:
        return True, "force=True"
    if champion is None:
        return True, "nothing is served yet"
    lower = direction(metric) == "min"
    gain = champion - challenger if lower else challenger - champion
    verdict = f"challenger {metric} {challenger:.4f} vs champion {champion:.4f} (needs {min_improvement:g} better)"
    return gain >= min_improvement and gain > 0, verdict


def live_instance_settings(state: dict[str, Any]) -> dict[str, Any] | None:
    """The running Serve instance's settings, as the REST API reports them; None when Serve is not running."""
    if not state.get("proxy_location"):
        return None
    return {key: state[key] for key in SERVE_INSTANCE_SETTINGS if state.get(key) is not None}


def live_applications(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The declarative config of every application that is live now."""
    return [app["deployed_app_config"] for app in (state.get("applications") or {}).values()
            if app.get("deployed_app_config")]


def instance_settings(live: dict[str, Any] | None, start_defaults: dict[str, Any],
                      requested: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The instance settings to deploy with, and the requested ones that a running Serve cannot take.

    A running instance keeps its settings; one that is not running starts with ``start_defaults``.
    ``requested`` settings go over either (a dict setting key by key), except the ones Serve takes
    only at start when it is already running.
    """
    settings = dict(live if live is not None else start_defaults)
    not_applied = []
    for key, value in (requested or {}).items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            value = {**settings[key], **value}
        if live is not None and key in START_ONLY_SETTINGS:
            if value != live.get(key):
                not_applied.append(key)
            continue
        settings[key] = value
    return settings, not_applied


def _user_config_value(app_config: dict[str, Any] | None, key: str) -> str | None:
    """``key`` of the first deployment's ``user_config`` that has it, in an application's config."""
    for deployment in (app_config or {}).get("deployments") or []:
        value = (deployment.get("user_config") or {}).get(key)
        if value:
            return str(value)
    return None


def app_owner(app_config: dict[str, Any] | None) -> str | None:
    """The DAG recorded as the application's owner, if any."""
    return _user_config_value(app_config, OWNER_KEY)


def app_model_version(app_config: dict[str, Any] | None) -> str | None:
    """The model version an application's config serves, if any."""
    return _user_config_value(app_config, "model_version")


def check_ownership(app_name: str, live_app: dict[str, Any] | None, dag_id: str, allow_takeover: bool) -> str | None:
    """Refuse to deploy over an application that another DAG owns, unless ``allow_takeover``.

    :param live_app: the application's entry in Serve's state (None when it is not live).
    :return: who is taken over from, in words, when an application owned by another DAG (or not
        deployed by this operator) is deployed over; None when the application is this DAG's, new,
        or was deployed by this operator before owners were recorded.
    """
    if live_app is None:
        return None
    config = live_app.get("deployed_app_config") or {}
    owner = app_owner(config)
    if owner == dag_id or (owner is None and config.get("import_path") == APP_IMPORT_PATH):
        return None
    if owner is not None:
        taken_from = f"DAG {owner!r}"
        problem = f"belongs to DAG {owner!r}"
        after = f" (DAG {owner!r} is then refused in turn)"
    else:
        import_path = config.get("import_path") or "none: deployed from code, not a config"
        taken_from = f"an application not deployed by RayServeDeployOperator (import_path {import_path!r})"
        problem = f"was not deployed by RayServeDeployOperator (import_path {import_path!r})"
        after = ""
    if allow_takeover:
        return taken_from
    raise ServeAppOwnershipError(
        f"Serve application {app_name!r} {problem}; DAG {dag_id!r} will not replace what it serves. Give "
        f"this DAG its own app_name and route_prefix, or pass allow_takeover=True to RayServeDeployOperator "
        f"to take the application over{after}."
    )


class ServeApplicationOperator(BaseOperator):
    """What every operator that changes one Serve application shares: the connection, the
    application's serving directory and history, its endpoint, and the config it PUTs.

    :param app_name: the Serve application: letters, digits, ``.``, ``_``, ``-``; None only where the
        subclass derives it before use. (templated)
    :param api_key_conn_id: a connection whose password is the endpoint's API key; none: no key.
    :param ready_timeout_s: how long a new version may take to answer.
    :param ray_conn_id: the ``ray`` connection.
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
        return f"{self.hook.serve_url}{self.route_prefix}"

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

    # -- HTTP to the endpoint -------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def _get(self, path: str) -> requests.Response | None:
        try:
            return requests.get(f"{self.endpoint}{path}", headers=self._headers(), timeout=10)
        except requests.RequestException:
            return None

    # -- the config ------------------------------------------------------------------------------

    def _serve_state(self) -> dict[str, Any]:
        return self.hook.get_serve_applications()

    def _live_app(self, state: dict[str, Any]) -> dict[str, Any] | None:
        return (state.get("applications") or {}).get(self.app_name)

    def _start_defaults(self) -> dict[str, Any]:
        port = urlsplit(self.hook.serve_url).port or 8000
        return {**SERVE_START_DEFAULTS, "http_options": {**SERVE_START_DEFAULTS["http_options"], "port": port}}

    def _with_app(self, instance: dict[str, Any], applications: list[dict[str, Any]],
                  ours: dict[str, Any] | None) -> dict[str, Any]:
        """The whole config to PUT: ``instance`` settings, the other applications as given, and ``ours``."""
        others = [app for app in applications if app.get("name") != self.app_name]
        return {**instance, "applications": [*others, *([ours] if ours else [])]}

    def _wait_for_version(self, version: str, deadline: float) -> None:
        """Until the app is RUNNING and three answers in a row report ``version``."""
        streak, last = 0, "no answer yet"
        while time.monotonic() < deadline:
            app = (self._serve_state().get("applications") or {}).get(self.app_name) or {}
            status = app.get("status")
            if status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise ServeModelRejectedError(f"application {self.app_name!r} is {status}: "
                                              f"{app.get('message', '')[-800:]}")
            response = self._get("/health") if status == "RUNNING" else None
            if response is not None and response.status_code == 200 and response.json().get("model_version") == version:
                streak += 1
                if streak >= 3:
                    return
            else:
                streak = 0
                last = f"status {status}, health {getattr(response, 'status_code', None)}"
            time.sleep(0.5)
        raise ServeDeployError(f"version {version} did not become ready within {self.ready_timeout_s:g} s ({last})")

    # -- history --------------------------------------------------------------------------------

    def _record(self, context: Context, entry: dict[str, Any]) -> None:
        """Append ``entry`` (with who decided and when) to the application's serving history, and
        push it as the task's ``decision`` XCom, which becomes the task's and the run's note."""
        history = read_history(self.serving_dir)
        ti = context["ti"]
        history.append({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "dag_id": ti.dag_id, "run_id": context["run_id"], "task_id": self.task_id, **entry})
        artifacts.write_json_atomic(history_uri(self.serving_dir), history)
        ti.xcom_push(key=DECISION_XCOM_KEY, value=entry)


class RayServeDeployOperator(ServeApplicationOperator):
    """Deploy a trained model behind a Ray Serve HTTP endpoint, champion/challenger gated.

    :param model: the RayTrain XCom (``model=train.output``: ``model_dir``, ``model_version``, ``metrics``). (templated)
    :param data: the preprocess task's XCom: its test split (``split_uris['test']``) and the
        preprocessor that wrote it (``preprocessor_uri``), which decodes the split's rows into the raw
        features the endpoint takes, for the smoke test and for scoring a champion that was evaluated
        on other data. (The model's own preprocessor may use another scaler.) (templated)
    :param compute: the GPUProbe compute spec; GPU replicas get a fraction of a GPU. (templated)
    :param app_name: the Serve application (one per model name): letters, digits, ``.``, ``_``, ``-``,
        starting with a letter or digit. None or empty: the DAG's id made one (other characters become
        ``-``, cut to 63), so each DAG serves its own application. (templated)
    :param route_prefix: the endpoint's path, e.g. ``/sales``. None or empty: ``/<app_name>``. (templated)
    :param metric: the test metric compared, one of the model's task: ``rmse``, ``mae`` (lower is
        better), ``acc_0_5``, ``acc_1_0`` (regression); ``log_loss`` (lower is better), ``accuracy``,
        ``macro_f1`` (classification). None: ``rmse`` for regression, ``log_loss`` for classification.
    :param min_improvement: how much better (absolute) the challenger must be. (templated)
    :param force: promote whatever the metrics say. (templated)
    :param on_schema_change: what a schema change does, when the served model cannot score this
        model's test rows (columns missing or new, other categories, another label, other classes or
        another task): ``promote`` serves this model, ``refuse`` keeps the served one (the task is
        skipped); either way the decision's reason is ``schema changed: champion needs …``. (templated)
    :param api_key_conn_id: a connection whose password is the endpoint's API key; none: no key.
    :param autoscaling_config: Serve autoscaling for the deployment.
    :param replica_cpus: CPUs each replica reserves (fractional keeps training room).
    :param allow_takeover: deploy even if the application belongs to another DAG (or was not
        deployed by this operator); this DAG then owns it. (templated)
    :param serve_instance_options: instance-wide Serve settings to set with this deploy, keyed as
        the top level of Serve's config (``proxy_location``, ``http_options``, ``grpc_options``,
        ``controller_options``, ``logging_config``, ``tracing_config``, ``target_capacity``); a dict
        setting is merged key by key. None: a running Serve keeps its settings, and one this deploy
        starts gets ``proxy_location: HeadOnly`` and HTTP on ``127.0.0.1`` at the connection's
        ``serve_url`` port. Serve takes ``proxy_location``, ``http_options``, ``grpc_options`` and
        ``controller_options`` only when it starts. (templated)
    :param ready_timeout_s: how long the new version may take to answer.
    :param smoke_rows: rows of the test split sent in the smoke test.
    """

    template_fields: Sequence[str] = (
        "model", "data", "compute", "app_name", "route_prefix", "min_improvement", "force", "on_schema_change",
        "allow_takeover", "serve_instance_options",
    )
    template_fields_renderers = {"model": "json", "data": "json", "compute": "json", "serve_instance_options": "json"}
    operator_extra_links = (RayServeEndpointLink(), RayServeDashboardLink())
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        model: dict[str, Any] | str,
        data: dict[str, Any] | str | None = None,
        compute: dict[str, Any] | str | None = None,
        app_name: str | None = None,
        route_prefix: str | None = None,
        metric: str | None = None,
        min_improvement: float = 0.0,
        force: bool = False,
        on_schema_change: str = DEFAULT_ON_SCHEMA_CHANGE,
        api_key_conn_id: str | None = None,
        autoscaling_config: dict[str, Any] | None = None,
        replica_cpus: float = 0.25,
        allow_takeover: bool = False,
        serve_instance_options: dict[str, Any] | str | None = None,
        ready_timeout_s: float = 180.0,
        smoke_rows: int = 8,
        ray_conn_id: str = RayHook.default_conn_name,
        artifact_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app_name=app_name, api_key_conn_id=api_key_conn_id, ready_timeout_s=ready_timeout_s,
                         ray_conn_id=ray_conn_id, artifact_root=artifact_root, **kwargs)
        self.model = model
        self.data = data
        self.compute = compute
        self.route_prefix = route_prefix
        self.metric = metric
        self.min_improvement = min_improvement
        self.force = force
        self.on_schema_change = on_schema_change
        self.autoscaling_config = autoscaling_config or {
            "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 8,
            "upscale_delay_s": 3, "downscale_delay_s": 120,
        }
        self.replica_cpus = replica_cpus
        self.allow_takeover = allow_takeover
        self.serve_instance_options = serve_instance_options
        self.smoke_rows = smoke_rows

    # -- HTTP to the endpoint -------------------------------------------------------------------

    def _post_predict(self, instances: list[dict[str, Any]]) -> requests.Response:
        return requests.post(f"{self.endpoint}/predict", json={"instances": instances},
                             headers=self._headers(), timeout=30)

    def _answer_error(self, response: requests.Response) -> ServeDeployError:
        """A ``/predict`` answer other than 200 as the error to raise: its status and the problems it names."""
        # 503/504: no replica free yet, which may pass; any other answer is the model's
        error = ServeDeployError if response.status_code in (503, 504) else ServeModelRejectedError
        problems = answer_problems(response)
        return error(f"POST {self.endpoint}/predict answered HTTP {response.status_code}"
                     + (f": {problems}" if problems else ""))

    def _predict(self, instances: list[dict[str, Any]]) -> dict[str, Any]:
        response = self._post_predict(instances)
        if response.status_code != 200:
            raise self._answer_error(response)
        return response.json()

    # -- the config ------------------------------------------------------------------------------

    def _check_ownership(self, state: dict[str, Any], dag_id: str) -> str | None:
        return check_ownership(self.app_name, self._live_app(state), dag_id, self.allow_takeover)

    def _app_config(self, model: dict[str, Any], compute: dict[str, Any], dag_id: str) -> dict[str, Any]:
        actor_options: dict[str, Any] = {"num_cpus": self.replica_cpus}
        if compute.get("use_gpu"):
            actor_options["num_gpus"] = 0.5  # fractional: serving shares the GPU with training
        # The handlers are short and batched: running them on the replica's event loop saves a
        # thread hop per request (measured in bench/bench_serve.py).
        runtime_env: dict[str, Any] = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
        if artifacts.is_remote(self.serving_dir):
            runtime_env["py_modules"] = [self._upload_code()]
        return {
            "name": self.app_name,
            "route_prefix": self.route_prefix,
            "import_path": APP_IMPORT_PATH,
            "args": {"api_key_sha256": hashlib.sha256(self.api_key.encode()).hexdigest() if self.api_key else None},
            "runtime_env": runtime_env,
            "deployments": [{
                "name": DEPLOYMENT_NAME,
                "user_config": {"model_dir": model["model_dir"], "model_version": model["model_version"],
                                OWNER_KEY: dag_id},
                "autoscaling_config": self.autoscaling_config,
                "ray_actor_options": actor_options,
                "max_ongoing_requests": 64,
            }],
        }

    def _upload_code(self) -> str:
        """Zip the Ray-side package once per content version into the artifact root; return its URI."""
        import io
        import zipfile
        from pathlib import Path

        from airflow_ray_ml.ray_job import RAYML_PACKAGE_DIR

        package = Path(RAYML_PACKAGE_DIR)
        files = sorted(p for p in package.rglob("*.py"))
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
        uri = artifacts.join(self.serving_dir, "code", f"rayml-{digest}.zip")
        if not artifacts.exists(uri):
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in files:
                    archive.write(path, str(Path("airflow_ray_ml_stages") / path.relative_to(package)))
            artifacts.write_bytes_atomic(uri, buffer.getvalue())
        return uri

    # -- waiting and checking -------------------------------------------------------------------

    def _test_rows(self) -> tuple[list[dict[str, Any]], list[float], ModelSchema]:
        """Raw rows (and labels: values, or class indexes) of the test split, decoded with the preprocessor
        that wrote it, and that preprocessor's schema (what the rows hold, the label and its classes)."""
        from airflow_ray_ml_stages.preprocessor import Preprocessor, raw_split_rows

        data = self.data if isinstance(self.data, dict) else {}
        test_split = (data.get("split_uris") or {}).get("test")
        if not test_split or not data.get("preprocessor_uri"):
            raise InvalidSpecError(
                "data must be the preprocess task's XCom (split_uris['test'] and preprocessor_uri), to smoke-test "
                f"and compare models: pass data=<preprocess task>.output; got {self.data!r:.200}"
            )
        preprocessor = Preprocessor.load(data["preprocessor_uri"])
        rows, labels = raw_split_rows(test_split, preprocessor)
        labels = [float(label) if preprocessor.classes is None else int(label) for label in labels]
        return rows, labels, ModelSchema.from_preprocessor(preprocessor)

    def _smoke_test(self, version: str, rows: list[dict[str, Any]], classes: list[Any] | None) -> None:
        answer = self._predict(rows[: self.smoke_rows])
        predictions = answer.get("predictions") or []
        if answer.get("model_version") != version:
            raise ServeModelRejectedError(f"smoke test answered by version {answer.get('model_version')!r}, "
                                          f"not {version!r}")
        count = min(self.smoke_rows, len(rows))
        if classes is None:
            usable = len(predictions) == count and all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) for p in predictions)
        else:
            probabilities = answer.get("probabilities") or []
            usable = (len(predictions) == count and all(p in classes for p in predictions)
                      and len(probabilities) == count
                      and all(len(row) == len(classes) and abs(sum(row) - 1) < 1e-3 for row in probabilities))
        if not usable:
            wanted = ("a finite number each" if classes is None
                      else f"one of {classes!r:.200} each, with probabilities that sum to 1")
            got = len(predictions) if isinstance(predictions, list) else 0
            raise ServeModelRejectedError(f"smoke test got unusable predictions: {got} answers for {count} rows, "
                                          f"wanted {wanted}")

    def _champion_metric(self, challenger: dict[str, Any], metric: str, rows, labels,
                         schema: ModelSchema) -> tuple[float | None, str | None, list[str]]:
        """The served model's test metric on the challenger's test split, its version, and the schema
        changes that keep it from scoring those rows (then no metric).

        The champion's ``/metadata`` (card and input schema) is compared with ``schema`` (the
        challenger's rows and labels) before any row is sent; a 422 that the comparison did not
        foresee counts as a schema change too, named by the fields it lists.
        """
        health = self._get("/health")
        if health is None or health.status_code != 200:
            return None, None, []
        metadata = self._get("/metadata").json()
        version, task = metadata.get("model_version"), metadata.get("task") or "regression"
        changes = schema_changes(ModelSchema.from_metadata(metadata), schema)
        if changes:
            return None, version, changes
        classes = challenger.get("classes")
        card_metric = ((metadata.get("metrics") or {}).get("test") or {}).get(metric)
        if metadata.get("data_fingerprint") == challenger.get("data_fingerprint") and card_metric is not None:
            return float(card_metric), version, []
        # Evaluated on other data: score the live champion on this test split, over HTTP.
        answers = []
        for start in range(0, len(rows), 512):
            response = self._post_predict(rows[start:start + 512])
            if response.status_code == 422:
                return None, version, [f"what its answer to the challenger's rows names: {answer_problems(response)}"]
            if response.status_code != 200:
                raise self._answer_error(response)
            answers.append(response.json())
        if classes is None:
            predictions = [value for answer in answers for value in answer["predictions"]]
            return task_metrics(task, labels, predictions)[metric], version, []
        # The champion's probabilities, in the order of the challenger's classes (the same set).
        columns = [answers[0]["classes"].index(value) for value in classes]
        probabilities = [[row[column] for column in columns] for answer in answers for row in answer["probabilities"]]
        return task_metrics(task, labels, probabilities)[metric], version, []

    def task_metric(self, model: dict[str, Any]) -> str:
        """The metric the gate compares: the operator's, or the model's task's default; checked against the task."""
        task = task_of(model.get("classes"))
        metric = self.metric or DEFAULT_METRIC[task]
        if metric not in TASK_METRICS[task]:
            raise InvalidSpecError(f"{self.task_id}.metric {metric!r} is not a {task} metric; the model's task takes "
                                   f"{list(TASK_METRICS[task])} (or leave metric unset: {DEFAULT_METRIC[task]!r})")
        return metric

    # -- the task -------------------------------------------------------------------------------

    def check_endpoint_names(self) -> None:
        """The application name and route, those not given derived, as Serve and the serving history's path accept them.

        A deploy serves the model its own DAG trained, so an ``app_name`` left out (None or empty,
        also as rendered) is the DAG's id made a valid name (:func:`app_name_for_dag`), and a
        ``route_prefix`` left out is ``/<app_name>``.
        """
        if coerce_value(self.app_name, str | None, f"{self.task_id}.app_name") is None:
            if not self.has_dag():
                raise InvalidSpecError(f"task {self.task_id!r} is in no DAG to name its Serve application after; "
                                       "pass app_name= (and route_prefix=)")
            self.app_name = app_name_for_dag(self.dag_id)
        self.check_app_name()
        if coerce_value(self.route_prefix, str | None, f"{self.task_id}.route_prefix") is None:
            self.route_prefix = f"/{self.app_name}"
        if not isinstance(self.route_prefix, str) or not ROUTE_PREFIX.fullmatch(self.route_prefix):
            raise InvalidSpecError(f"route_prefix must be a path such as '/sales' (letters, digits, '.', '_', '-', "
                                   f"'/'), got {self.route_prefix!r}")

    def coerce_settings(self) -> None:
        """Templated values rendered as text take their types, as the stage operators' do (airflow_ray_ml.contract)."""
        self.model = coerce_value(self.model, dict[str, Any], f"{self.task_id}.model")
        self.data = coerce_value(self.data, dict[str, Any] | None, f"{self.task_id}.data")
        self.compute = coerce_value(self.compute, dict[str, Any] | None, f"{self.task_id}.compute")
        self.min_improvement = operator_setting(self.min_improvement, float, f"{self.task_id}.min_improvement")
        self.force = operator_setting(self.force, bool, f"{self.task_id}.force")
        self.on_schema_change = operator_setting(self.on_schema_change, str, f"{self.task_id}.on_schema_change")
        if self.on_schema_change not in SCHEMA_CHANGE_POLICIES:
            raise InvalidSpecError(f"{self.task_id}.on_schema_change must be one of {list(SCHEMA_CHANGE_POLICIES)}, "
                                   f"got {self.on_schema_change!r}")
        self.allow_takeover = operator_setting(self.allow_takeover, bool, f"{self.task_id}.allow_takeover")
        self.serve_instance_options = coerce_value(self.serve_instance_options, dict[str, Any] | None,
                                                   f"{self.task_id}.serve_instance_options")
        options = self.serve_instance_options
        if options is not None and (not isinstance(options, dict) or set(options) - set(SERVE_INSTANCE_SETTINGS)):
            raise InvalidSpecError(f"{self.task_id}.serve_instance_options takes only Serve's instance-wide "
                                   f"settings {list(SERVE_INSTANCE_SETTINGS)}; got {options!r:.200}")

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_ray_ml.compat import AirflowSkipException

        self.check_endpoint_names()
        self.coerce_settings()
        model = dict(self.model) if isinstance(self.model, dict) else {}
        for key in ("model_dir", "model_version", "metrics"):
            if key not in model:
                raise InvalidSpecError(f"model must be the RayTrain XCom (model=train.output) with {key!r}; "
                                       f"got {self.model!r:.200}")
        metric = self.task_metric(model)
        challenger = float(model["metrics"]["test"][metric])
        compute = dict(self.compute) if isinstance(self.compute, dict) else {}
        self.hook.check_access()
        dag_id = context["ti"].dag_id
        state = self._serve_state()
        self._check_ownership(state, dag_id)  # before anything is scored or written
        rows, labels, schema = self._test_rows()
        record = {"dashboard_url": self.hook.dashboard_url, "endpoint": self.endpoint, "app": self.app_name}
        context["ti"].xcom_push(key=SERVE_XCOM_KEY, value=record)

        champion, champion_version, changes = self._champion_metric(model, metric, rows, labels, schema)
        promote, why = gate(challenger, champion, metric, self.min_improvement, self.force)
        if changes:  # nothing to compare: the setting decides (force still promotes)
            promote = self.force or self.on_schema_change == "promote"
            why = schema_change_reason(changes) + (" (force=True)" if self.force else "")
        summary = {"challenger_version": model["model_version"], "champion_version": champion_version,
                   "metric": metric, "challenger": challenger, "champion": champion, "reason": why}
        if not promote:
            owner = app_owner((self._live_app(state) or {}).get("deployed_app_config"))
            self._record(context, {"action": "kept_champion", "owner": owner, **summary})
            self.log.info("Kept champion %s: %s", champion_version, why)
            raise AirflowSkipException(f"kept champion {champion_version}: {why}")

        state = self._serve_state()
        taken_from = self._check_ownership(state, dag_id)  # again: another DAG may have deployed meanwhile
        live_instance, applications = live_instance_settings(state), live_applications(state)
        previous_app = next((app for app in applications if app.get("name") == self.app_name), None)
        instance, not_applied = instance_settings(live_instance, self._start_defaults(), self.serve_instance_options)
        if not_applied:
            self.log.warning("Serve is running, so %s stay as they are: Serve takes them only when it starts",
                             ", ".join(not_applied))
        if taken_from:
            self.log.warning("Taking application %r over from %s (allow_takeover=True)", self.app_name, taken_from)
        previous_uri = artifacts.join(self.serving_dir, "previous_config.json")
        previous = {**live_instance, "applications": applications} if live_instance is not None else None
        artifacts.write_json_atomic(previous_uri, {"config": previous, "version": champion_version,
                                                   "owner": app_owner(previous_app)})
        config = self._with_app(instance, applications, self._app_config(model, compute, dag_id))
        self.log.info("Promoting %s (%s); previous config kept in %s", model["model_version"], why, previous_uri)
        ownership = {"owner": dag_id, "previous_owner": app_owner(previous_app)}
        try:
            self.hook.put_serve_applications(config)
            self._wait_for_version(model["model_version"], time.monotonic() + self.ready_timeout_s)
            self._smoke_test(model["model_version"], rows, model.get("classes"))
        except Exception as err:
            self.log.error("Deploy of %s failed (%s); restoring the previous config", model["model_version"], err)
            self._rollback(live_instance, previous_app, champion_version)
            self._record(context, {"action": "rolled_back", "error": str(err), "owner": app_owner(previous_app),
                                   **summary})
            # the model's own fault fails the task at once; anything else (time, the cluster) may pass
            error = ServeModelRejectedError if isinstance(err, ServeModelRejectedError) else ServeDeployError
            raise error(
                f"deploying {model['model_version']} failed and {champion_version or 'the previous state'} "
                f"was restored: {err}"
            ) from None
        artifacts.write_json_atomic(config_uri(self.serving_dir, model["model_version"]), config)
        self._record(context, {"action": "promoted", **ownership, **summary})
        self.log.info("Serving %s at %s", model["model_version"], self.endpoint)
        self._publish_assets(context, model)
        return {"action": "promoted", "endpoint": self.endpoint, "model_version": model["model_version"], **summary}

    def _publish_assets(self, context: Context, model: dict[str, Any]) -> None:
        """Attach the promoted model (URI, version, test metrics, endpoint) to each outlet Asset's event.

        Only a promotion reaches here: a kept champion skips the task and a failed deploy raises,
        so neither emits an asset event and DAGs scheduled on the asset run only for new models.
        """
        from airflow.sdk import Asset

        extra = {"model_dir": model["model_dir"], "model_version": model["model_version"],
                 "family": model.get("family"), "metrics": model["metrics"].get("test", {}),
                 "endpoint": self.endpoint, "app": self.app_name}
        for outlet in self.outlets or []:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = extra
                self.log.info("Asset %s: model %s", outlet.name, model["model_version"])

    def _rollback(self, live_instance: dict[str, Any] | None, previous_app: dict[str, Any] | None,
                  version: str | None) -> None:
        """Put this application back as it was (or remove it when it was not live), and Serve's settings.

        The other applications are sent as they are live now, so one that another DAG deployed
        meanwhile stays. The instance settings are those from before this deploy, or, when this
        deploy started Serve, those it runs with.
        """
        state = self._serve_state()
        instance = live_instance if live_instance is not None else live_instance_settings(state) or {}
        self.hook.put_serve_applications(self._with_app(instance, live_applications(state), previous_app))
        if version:
            self._wait_for_version(version, time.monotonic() + self.ready_timeout_s)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Lineage (airflow_ray_ml.lineage): the model directory in; the endpoint out when this run
        promoted it (a kept champion ends skipped and a failed deploy is rolled back)."""
        from airflow_ray_ml.lineage import operator_lineage

        model = self.model if isinstance(self.model, dict) else {}
        promoted = task_instance.state == "success"
        return operator_lineage(inputs=[model.get("model_dir")], outputs=[self.endpoint] if promoted else [])
