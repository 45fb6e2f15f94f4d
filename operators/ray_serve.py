"""RayServeDeployOperator: promote a trained model to Ray Serve only if it beats the served one.

The operator talks to the Serve REST API (a declarative config, not ``serve.run``): it reads the
live champion's card, gates the challenger on the test metric (``airflow_ray_ml.serve_gate``),
applies the new config (a ``user_config`` change, so live replicas ``reconfigure()`` in place),
waits until the application is RUNNING and answers with the new version, smoke-tests the endpoint
with rows of the test split, and on any failure restores the previous config and fails with the
reason. Every decision is appended to ``<artifact_root>/serving/<app>/history.json``
(``airflow_ray_ml.serve_history``). Every call to the endpoint goes through ``RayHook``.

A deploy changes only its own application: the other applications and the Serve instance's own
settings (proxy location, HTTP options, target capacity, ...) are sent back as they are live, unless
``serve_instance_options`` asks otherwise (``airflow_ray_ml.serve_config``). The application records
the DAG that deployed it, and a deploy from another DAG is refused unless ``allow_takeover=True``
(``airflow_ray_ml.serve_apps``).

A champion that cannot score the challenger's rows (other columns, label, classes or task:
``airflow_ray_ml.serve_schema``) is not compared: ``on_schema_change`` decides, and the decision
says what changed.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any, Sequence

from airflow_ray_ml.contract import coerce_value, operator_setting
from airflow_ray_ml.errors import InvalidSpecError, ServeDeployError, ServeModelRejectedError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.links.ray import SERVE_XCOM_KEY, RayServeDashboardLink, RayServeEndpointLink
from airflow_ray_ml.serve_application import ServeApplicationOperator
from airflow_ray_ml.serve_apps import (
    APP_IMPORT_PATH, DEPLOYMENT_NAME, OWNER_KEY, ROUTE_PREFIX, app_name_for_dag, app_owner, check_ownership,
)
from airflow_ray_ml.serve_config import (
    SERVE_INSTANCE_SETTINGS, instance_settings, live_applications, live_instance_settings, upload_code,
)
from airflow_ray_ml.serve_gate import answer_error, champion_metric, check_smoke_answer, gate
from airflow_ray_ml.serve_history import config_uri, previous_config_uri
from airflow_ray_ml.serve_schema import (
    DEFAULT_ON_SCHEMA_CHANGE, SCHEMA_CHANGE_POLICIES, ModelSchema, schema_change_reason,
)
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import task_of
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, TASK_METRICS

if TYPE_CHECKING:
    from airflow.sdk import Context


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

    # -- the endpoint ---------------------------------------------------------------------------

    def _predict(self, instances: list[dict[str, Any]]) -> dict[str, Any]:
        response = self.hook.post_endpoint_predict(self.route_prefix, instances, api_key=self.api_key)
        if response.status_code != 200:
            raise answer_error(response)
        return response.json()

    # -- the config ------------------------------------------------------------------------------

    def _check_ownership(self, state: dict[str, Any], dag_id: str) -> str | None:
        return check_ownership(self.app_name, self.live_app(state), dag_id, self.allow_takeover)

    def app_config(self, model: dict[str, Any], compute: dict[str, Any], dag_id: str) -> dict[str, Any]:
        """This application's entry in Serve's config: ``model`` served by replicas sized for ``compute``, owned by ``dag_id``."""
        actor_options: dict[str, Any] = {"num_cpus": self.replica_cpus}
        if compute.get("use_gpu"):
            actor_options["num_gpus"] = 0.5  # fractional: serving shares the GPU with training
        # The handlers are short and batched: running them on the replica's event loop saves a
        # thread hop per request (measured in bench/bench_serve.py).
        runtime_env: dict[str, Any] = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
        if artifacts.is_remote(self.serving_dir):
            runtime_env["py_modules"] = [upload_code(self.serving_dir)]
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

    # -- checking --------------------------------------------------------------------------------

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
        check_smoke_answer(self._predict(rows[: self.smoke_rows]), version, min(self.smoke_rows, len(rows)), classes)

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
        state = self.serve_state()
        self._check_ownership(state, dag_id)  # before anything is scored or written
        rows, labels, schema = self._test_rows()
        record = {"dashboard_url": self.hook.dashboard_url, "endpoint": self.endpoint, "app": self.app_name}
        context["ti"].xcom_push(key=SERVE_XCOM_KEY, value=record)

        champion, champion_version, changes = champion_metric(self.hook, self.route_prefix, self.api_key, model, metric,
                                                              rows, labels, schema)
        promote, why = gate(challenger, champion, metric, self.min_improvement, self.force)
        if changes:  # nothing to compare: the setting decides (force still promotes)
            promote = self.force or self.on_schema_change == "promote"
            why = schema_change_reason(changes) + (" (force=True)" if self.force else "")
        summary = {"challenger_version": model["model_version"], "champion_version": champion_version,
                   "metric": metric, "challenger": challenger, "champion": champion, "reason": why}
        if not promote:
            owner = app_owner((self.live_app(state) or {}).get("deployed_app_config"))
            self.record(context, {"action": "kept_champion", "owner": owner, **summary})
            self.log.info("Kept champion %s: %s", champion_version, why)
            raise AirflowSkipException(f"kept champion {champion_version}: {why}")

        state = self.serve_state()
        taken_from = self._check_ownership(state, dag_id)  # again: another DAG may have deployed meanwhile
        live_instance, applications = live_instance_settings(state), live_applications(state)
        previous_app = next((app for app in applications if app.get("name") == self.app_name), None)
        instance, not_applied = instance_settings(live_instance, self.start_settings(), self.serve_instance_options)
        if not_applied:
            self.log.warning("Serve is running, so %s stay as they are: Serve takes them only when it starts",
                             ", ".join(not_applied))
        if taken_from:
            self.log.warning("Taking application %r over from %s (allow_takeover=True)", self.app_name, taken_from)
        previous_uri = previous_config_uri(self.serving_dir)
        previous = {**live_instance, "applications": applications} if live_instance is not None else None
        artifacts.write_json_atomic(previous_uri, {"config": previous, "version": champion_version,
                                                   "owner": app_owner(previous_app)})
        config = self.with_app(instance, applications, self.app_config(model, compute, dag_id))
        self.log.info("Promoting %s (%s); previous config kept in %s", model["model_version"], why, previous_uri)
        ownership = {"owner": dag_id, "previous_owner": app_owner(previous_app)}
        try:
            self.hook.put_serve_applications(config)
            self.wait_for_version(model["model_version"], time.monotonic() + self.ready_timeout_s)
            self._smoke_test(model["model_version"], rows, model.get("classes"))
        except Exception as err:
            self.log.error("Deploy of %s failed (%s); restoring the previous config", model["model_version"], err)
            self._rollback(live_instance, previous_app, champion_version)
            self.record(context, {"action": "rolled_back", "error": str(err), "owner": app_owner(previous_app),
                                  **summary})
            # the model's own fault fails the task at once; anything else (time, the cluster) may pass
            error = ServeModelRejectedError if isinstance(err, ServeModelRejectedError) else ServeDeployError
            raise error(
                f"deploying {model['model_version']} failed and {champion_version or 'the previous state'} "
                f"was restored: {err}"
            ) from None
        artifacts.write_json_atomic(config_uri(self.serving_dir, model["model_version"]), config)
        self.record(context, {"action": "promoted", **ownership, **summary})
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
        state = self.serve_state()
        instance = live_instance if live_instance is not None else live_instance_settings(state) or {}
        self.hook.put_serve_applications(self.with_app(instance, live_applications(state), previous_app))
        if version:
            self.wait_for_version(version, time.monotonic() + self.ready_timeout_s)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Lineage (airflow_ray_ml.lineage): the model directory in; the endpoint out when this run
        promoted it (a kept champion ends skipped and a failed deploy is rolled back)."""
        from airflow_ray_ml.lineage import operator_lineage

        model = self.model if isinstance(self.model, dict) else {}
        promoted = task_instance.state == "success"
        return operator_lineage(inputs=[model.get("model_dir")], outputs=[self.endpoint] if promoted else [])
