"""RayServeDeployOperator: promote a trained model to Ray Serve only if it beats the served one.

The operator talks to the Serve REST API (a declarative config, not ``serve.run``): it scores the
live champion on the challenger's test rows and gates the challenger on the test metric, beyond
the rows' noise (a paired bootstrap; ``airflow_ray_ml.serve_gate``),
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

A challenger that passed the gate may first meet live traffic beside the champion, in shadow or
canary (``rollout``; ``airflow_ray_ml.serve_rollout`` judges what it saw), and a person may have
to approve the promotion (``approval``; ``airflow_ray_ml.serve_approval``, Airflow's HITL).
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Sequence

from airflow_ray_ml.contract import coerce_value, operator_setting
from airflow_ray_ml.errors import InvalidSpecError, ServeDeployError, ServeModelRejectedError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.links.ray import SERVE_XCOM_KEY, RayServeDashboardLink, RayServeEndpointLink
from airflow_ray_ml.plugins.decision_notes import STARTED_BY
from airflow_ray_ml.ray_score import drift_extras
from airflow_ray_ml.serve_application import READY_POLL_S, ServeApplicationOperator
from airflow_ray_ml.serve_apps import (
    APP_IMPORT_PATH, DEPLOYMENT_NAME, OWNER_KEY, ROUTE_PREFIX, app_model_dir, app_name_for_dag, app_owner,
    check_ownership,
)
from airflow_ray_ml.serve_config import (
    SERVE_INSTANCE_SETTINGS, instance_settings, live_applications, live_instance_settings, upload_code,
)
from airflow_ray_ml.serve_gate import (
    DEFAULT_MIN_CONFIDENCE, answer_error, champion_metric, check_smoke_answer, gate, paired_confidence,
)
from airflow_ray_ml import serve_approval
from airflow_ray_ml.serve_history import config_uri, previous_config_uri, run_record_uri, trial_uri
from airflow_ray_ml.serve_rollout import (
    POLL_S, Rollout, challenger_deployment, evidence, live_metrics, now_iso, seen_stats, verdict, without_rollout,
)
from airflow_ray_ml.serve_schema import (
    DEFAULT_ON_SCHEMA_CHANGE, SCHEMA_CHANGE_POLICIES, ModelSchema, schema_change_reason,
)
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TEST_PREDICTIONS_NAME, task_of
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, TASK_METRICS

if TYPE_CHECKING:
    from airflow.sdk import Context

# How often a live trial's progress is kept for the page (``serve_history.trial_uri``).
TRIAL_RECORD_EVERY_S = 5.0

# The XCom that keeps a deploy's gate decision while it waits for approval.
PENDING_XCOM_KEY = "pending_promotion"


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
    :param min_confidence: how sure the gate must be that the challenger is better (by more than
        ``min_improvement``) on the test rows beyond their noise: the share, in [0, 1), of paired
        bootstrap resamples of the test rows in which it is (both models' answers to each row: the
        challenger's from its model directory, the champion's over its endpoint). 0: the plain
        comparison of the two metrics decides, any difference promotes. (templated)
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
    :param rollout: how a challenger that passed the gate meets live traffic before it is promoted
        (``airflow_ray_ml.serve_rollout``): ``direct`` (promoted at once), ``shadow`` (a share of live
        requests is mirrored to it; clients get the champion's answers) or ``canary`` (a share is
        answered by it; the champion answers what it fails). With nothing served yet, or a schema
        change, it is promoted directly. (templated)
    :param rollout_share: the share of requests the challenger gets, in (0, 1]; None: all of them
        in shadow, one in ten in canary. (templated)
    :param rollout_rows: rows compared (shadow) or answered (canary) before the verdict.
    :param rollout_timeout_s: the longest the rollout lasts; the verdict is on what it saw by then.
    :param rollout_labels: a CSV or Parquet file of rows that clients sent, with the label that
        became known later (every input column and the label column): both models are scored on
        the mirrored rows it labels and the gate decides on them. A path or URL from Params must lie
        under the allowed sources (``airflow_ray_ml.confine``). (templated)
    :param max_error_rate: how much more often than the champion the challenger may fail requests
        (a share); more rolls it back.
    :param max_latency_ratio: how many times the champion's median answer time the challenger's
        may be; more keeps the champion.
    :param approval: ask a person to approve the promotion (Airflow's Human-in-the-loop form, with
        the test metrics, the live comparison and the drift that started the run), once the gate
        and the rollout would promote; a rejection keeps the champion and records the reason. (templated)
    :param approval_timeout: how long the approval may wait; then it counts as rejected. None: no limit.
    :param approvers: the users who may answer (Airflow user names); None: anyone who may edit the DAG.
    """

    template_fields: Sequence[str] = (
        "model", "data", "compute", "app_name", "route_prefix", "min_improvement", "min_confidence", "force", "on_schema_change",
        "allow_takeover", "serve_instance_options", "rollout", "rollout_share", "rollout_labels", "approval",
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
        min_confidence: float | str = DEFAULT_MIN_CONFIDENCE,
        force: bool = False,
        on_schema_change: str = DEFAULT_ON_SCHEMA_CHANGE,
        api_key_conn_id: str | None = None,
        autoscaling_config: dict[str, Any] | None = None,
        replica_cpus: float = 0.25,
        allow_takeover: bool = False,
        serve_instance_options: dict[str, Any] | str | None = None,
        ready_timeout_s: float = 180.0,
        smoke_rows: int = 8,
        rollout: str = Rollout.mode,
        rollout_share: float | str | None = Rollout.share,
        rollout_rows: int = Rollout.rows,
        rollout_timeout_s: float = Rollout.timeout_s,
        rollout_labels: str | None = Rollout.labels,
        max_error_rate: float = Rollout.max_error_rate,
        max_latency_ratio: float = Rollout.max_latency_ratio,
        approval: bool | str = False,
        approval_timeout: timedelta | None = None,
        approvers: list[str] | None = None,
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
        self.min_confidence = min_confidence
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
        self.rollout = rollout
        self.rollout_share = rollout_share
        self.rollout_rows = rollout_rows
        self.rollout_timeout_s = rollout_timeout_s
        self.rollout_labels = rollout_labels
        self.max_error_rate = max_error_rate
        self.max_latency_ratio = max_latency_ratio
        self.approval = approval
        self.approval_timeout = approval_timeout
        self.approvers = approvers

    # -- the endpoint ---------------------------------------------------------------------------

    def _predict(self, instances: list[dict[str, Any]]) -> dict[str, Any]:
        response = self.hook.post_endpoint_predict(self.route_prefix, instances, api_key=self.api_key)
        if response.status_code != 200:
            raise answer_error(response)
        return response.json()

    # -- the config ------------------------------------------------------------------------------

    def _check_ownership(self, state: dict[str, Any], dag_id: str) -> str | None:
        return check_ownership(self.app_name, self.live_app(state), dag_id, self.allow_takeover)

    def app_config(self, model: dict[str, Any], compute: dict[str, Any], dag_id: str,
                   challenger: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None) -> dict[str, Any]:
        """This application's entry in Serve's config: ``model`` served by replicas sized for ``compute``,
        owned by ``dag_id``; with ``challenger`` beside it as ``rollout`` (its ``user_config`` entry) says."""
        actor_options: dict[str, Any] = {"num_cpus": self.replica_cpus}
        if compute.get("use_gpu"):
            actor_options["num_gpus"] = 0.5  # fractional: serving shares the GPU with training
        # The handlers are short and batched: running them on the replica's event loop saves a
        # thread hop per request (measured in bench/bench_serve.py).
        runtime_env: dict[str, Any] = {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}}
        if artifacts.is_remote(self.serving_dir):
            runtime_env["py_modules"] = [upload_code(self.serving_dir)]
        user_config = {"model_dir": model["model_dir"], "model_version": model["model_version"], OWNER_KEY: dag_id}
        deployments = [{"name": DEPLOYMENT_NAME, "user_config": user_config,
                        "autoscaling_config": self.autoscaling_config, "ray_actor_options": actor_options,
                        "max_ongoing_requests": 64}]
        if challenger is not None and rollout is not None:
            user_config["rollout"] = rollout
        deployments.append(challenger_deployment(actor_options, challenger, rollout))
        return {
            "name": self.app_name,
            "route_prefix": self.route_prefix,
            "import_path": APP_IMPORT_PATH,
            "args": {"api_key_sha256": hashlib.sha256(self.api_key.encode()).hexdigest() if self.api_key else None},
            "runtime_env": runtime_env,
            "deployments": deployments,
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

    def _test_answers(self, model: dict[str, Any], labels: list[float]) -> list[Any] | None:
        """The challenger's answer to each test row, from its model directory (the train stage wrote
        them); None, with a warning, where there are none or they are not of these rows."""
        uri = artifacts.join(model["model_dir"], TEST_PREDICTIONS_NAME)
        if not artifacts.exists(uri):
            self.log.warning("No %s in the challenger's model directory (trained before the gate measured noise): "
                             "the plain comparison decides", TEST_PREDICTIONS_NAME)
            return None
        kept = artifacts.read_json(uri)
        found = kept.get("labels") or []
        if len(found) != len(labels) or any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(found, labels)):
            self.log.warning("The challenger's %s answer other rows than its test split's %d: the plain comparison "
                             "decides", TEST_PREDICTIONS_NAME, len(labels))
            return None
        return kept["predictions"]

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
        self.min_confidence = operator_setting(self.min_confidence, float, f"{self.task_id}.min_confidence")
        if not 0 <= self.min_confidence < 1:
            raise InvalidSpecError(f"{self.task_id}.min_confidence must be in [0, 1) (a share of resamples, e.g. "
                                   f"0.95; 0 for the plain comparison), got {self.min_confidence!r}")
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
        self.approval = operator_setting(self.approval, bool, f"{self.task_id}.approval")
        self.rollout_labels = coerce_value(self.rollout_labels, str | None, f"{self.task_id}.rollout_labels")

    @property
    def rollout_plan(self) -> Rollout:
        """The rollout settings, checked (``airflow_ray_ml.serve_rollout.Rollout``)."""
        share = coerce_value(self.rollout_share, float | None, f"{self.task_id}.rollout_share")
        return Rollout(mode=operator_setting(self.rollout, str, f"{self.task_id}.rollout"), share=share,
                       rows=self.rollout_rows, timeout_s=self.rollout_timeout_s, labels=self.rollout_labels,
                       max_error_rate=self.max_error_rate, max_latency_ratio=self.max_latency_ratio)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_ray_ml.compat import AirflowSkipException

        self.check_endpoint_names()
        self.coerce_settings()
        rollout = self.rollout_plan
        model = self._model_xcom()
        metric = self.task_metric(model)
        challenger = float(model["metrics"]["test"][metric])
        compute = dict(self.compute) if isinstance(self.compute, dict) else {}
        self.hook.check_access()
        dag_id = context["ti"].dag_id
        state = self.serve_state()
        self._check_ownership(state, dag_id)  # before anything is scored or written
        if rollout.labels:
            from airflow_ray_ml.confine import confine_sources

            confine_sources(rollout.labels, ray_conn_id=self.ray_conn_id, artifact_root=self.artifact_root)
        rows, labels, schema = self._test_rows()
        record = {"dashboard_url": self.hook.dashboard_url, "endpoint": self.endpoint, "app": self.app_name}
        context["ti"].xcom_push(key=SERVE_XCOM_KEY, value=record)

        answers = self._test_answers(model, labels) if self.min_confidence > 0 and not self.force else None
        champion, champion_version, changes, champion_answers = champion_metric(
            self.hook, self.route_prefix, self.api_key, model, metric, rows, labels, schema, per_row=answers is not None)
        confidence = None
        if answers is not None and champion_answers is not None:
            confidence = paired_confidence(metric, labels, answers, champion_answers, self.min_improvement)
        promote, why = gate(challenger, champion, metric, self.min_improvement, self.force, confidence,
                            self.min_confidence)
        if changes:  # nothing to compare: the setting decides (force still promotes)
            promote = self.force or self.on_schema_change == "promote"
            why = schema_change_reason(changes) + (" (force=True)" if self.force else "")
        summary = {"challenger_version": model["model_version"], "champion_version": champion_version,
                   "metric": metric, "challenger": challenger, "champion": champion, "reason": why}
        if confidence is not None:
            summary.update(confidence=confidence, min_confidence=self.min_confidence)
        if not promote:
            owner = app_owner((self.live_app(state) or {}).get("deployed_app_config"))
            self.record(context, {"action": "kept_champion", "owner": owner, **summary})
            self.log.info("Kept champion %s: %s", champion_version, why)
            raise AirflowSkipException(f"kept champion {champion_version}: {why}")

        state = self.serve_state()
        taken_from = self._check_ownership(state, dag_id)  # again: another DAG may have deployed meanwhile
        live_instance, applications = live_instance_settings(state), live_applications(state)
        previous_app = next((app for app in applications if app.get("name") == self.app_name), None)
        if taken_from:
            self.log.warning("Taking application %r over from %s (allow_takeover=True)", self.app_name, taken_from)
        previous_uri = previous_config_uri(self.serving_dir)
        previous = {**live_instance, "applications": applications} if live_instance is not None else None
        artifacts.write_json_atomic(previous_uri, {"config": previous, "version": champion_version,
                                                   "owner": app_owner(previous_app)})
        if rollout.live and champion_version and not changes and not self.force:
            summary["rollout"] = self._try_live(context, model, compute, dag_id, rollout, summary, previous_app)
            summary["reason"] = f"{why}; {rollout.mode}: {summary['rollout']['verdict']}"
        elif rollout.live:
            self.log.info("No %s: %s, so the challenger is promoted directly", rollout.mode,
                          "force=True" if self.force else "the schema changed" if changes else "nothing is served yet")
        if self.approval:
            context["ti"].xcom_push(key=PENDING_XCOM_KEY, value=summary)
            self.log.info("Asking for approval to promote %s", model["model_version"])
            serve_approval.ask(self, context, subject=f"Promote {model['model_version']} to {self.app_name}?",
                               body=serve_approval.evidence_body(summary, summary.get("rollout"), self._drift(context)),
                               timeout=self.approval_timeout, approvers=self.approvers,
                               method_name="resume_after_approval")
        return self._promote(context, model, compute, dag_id, summary)

    def resume_after_approval(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The approval's answer: promote, or keep the champion with the reason given."""
        from airflow_ray_ml.compat import AirflowSkipException

        self.check_endpoint_names()
        self.coerce_settings()
        model = self._model_xcom()
        summary = context["ti"].xcom_pull(task_ids=self.task_id, key=PENDING_XCOM_KEY,
                                          map_indexes=context["ti"].map_index)
        if not isinstance(summary, dict):
            raise ServeDeployError(f"the gate's decision of this task ({PENDING_XCOM_KEY!r} XCom) is gone; "
                                   "clear the task to run the gate again")
        answer = serve_approval.answer_of(event)
        summary = {**summary, "approval": answer}
        if answer["approved"]:
            self.log.info("Approved by %s", answer["by"])
            return self._promote(context, model, dict(self.compute) if isinstance(self.compute, dict) else {},
                                 context["ti"].dag_id, summary)
        if summary.get("rollout"):
            self._end_rollout()
        why = f"rejected by {answer['by'] or 'no one'}" + (f": {answer['reason']}" if answer["reason"] else "")
        state = self.serve_state()
        owner = app_owner((self.live_app(state) or {}).get("deployed_app_config"))
        self.record(context, {"action": "kept_champion", "owner": owner, **summary, "reason": why})
        self.log.info("Kept champion %s: %s", summary.get("champion_version"), why)
        raise AirflowSkipException(f"kept champion {summary.get('champion_version')}: {why}")

    def _model_xcom(self) -> dict[str, Any]:
        model = dict(self.model) if isinstance(self.model, dict) else {}
        for key in ("model_dir", "model_version", "metrics"):
            if key not in model:
                raise InvalidSpecError(f"model must be the RayTrain XCom (model=train.output) with {key!r}; "
                                       f"got {self.model!r:.200}")
        return model

    def _drift(self, context: Context) -> list[str]:
        """The drift that started this run: the reasons in the drift events it consumed, or, for a
        retraining that ``DriftRetrainOperator`` triggered, its note's (the first sentence after "Started by")."""
        events = [event for events in (context.get("triggering_asset_events") or {}).values() for event in events]
        reasons = [str(extra["reason"]) for extra in drift_extras(getattr(event, "extra", None) for event in events)]
        note = getattr(context.get("dag_run"), "note", None) or ""
        if not reasons and note.startswith(STARTED_BY):
            reasons = [note[len(STARTED_BY):].split(" · ")[0]]
        return reasons

    def _put_app(self, app: dict[str, Any] | None) -> dict[str, Any]:
        """PUT this application's config ``app`` beside the other live applications and Serve's live
        settings; return the whole config put."""
        state = self.serve_state()
        live_instance = live_instance_settings(state)
        instance, not_applied = instance_settings(live_instance, self.start_settings(), self.serve_instance_options)
        if not_applied:
            self.log.warning("Serve is running, so %s stay as they are: Serve takes them only when it starts",
                             ", ".join(not_applied))
        config = self.with_app(instance, live_applications(state), app)
        self.hook.put_serve_applications(config)
        return config

    def _try_live(self, context: Context, model: dict[str, Any], compute: dict[str, Any], dag_id: str,
                  rollout: Rollout, summary: dict[str, Any], previous_app: dict[str, Any] | None) -> dict[str, Any]:
        """Run the challenger beside the champion as ``rollout`` says, until its verdict; return what it saw.

        A rollback or a kept champion ends the task here (the champion serves alone again); a
        promotion returns, and the challenger keeps its share of traffic until promoted.
        """
        from airflow_ray_ml.compat import AirflowSkipException

        champion_config = self.live_app(self.serve_state()) or {}
        champion_model = {"model_dir": app_model_dir(champion_config.get("deployed_app_config")), "model_version": summary["champion_version"]}
        config = self.app_config(champion_model, compute, dag_id, challenger=model,
                                 rollout=rollout.user_config(model["model_version"]))
        self.log.info("Starting the %s of %s beside %s (%.0f%% of requests)", rollout.mode, model["model_version"],
                      summary["champion_version"], rollout.traffic_share * 100)
        stats, started_at = None, now_iso()
        try:
            self._trial_running = True
            self._put_app(config)
            stats = self._watch(rollout, model["model_version"], summary["champion_version"], started_at)
            live = self._live_metrics(rollout, stats, model, summary["metric"]) if stats else None
        except Exception as err:
            self.log.error("The %s of %s failed (%s); the champion serves alone again", rollout.mode,
                           model["model_version"], err)
            self._end_rollout()
            self.record(context, {"action": "rolled_back", "error": str(err), "owner": app_owner(previous_app),
                                  **summary, "rollout": evidence(rollout, stats, None, str(err), started_at, now_iso())})
            error = ServeModelRejectedError if isinstance(err, (ServeModelRejectedError, InvalidSpecError)) \
                else ServeDeployError
            raise error(f"the {rollout.mode} of {model['model_version']} failed: {err}") from None
        ended_at = now_iso()
        action, why = verdict(stats, rollout, live, lambda mine, theirs: gate(
            mine, theirs, summary["metric"], self.min_improvement, False))
        seen = evidence(rollout, stats, live, why, started_at, ended_at)
        self.log.info("%s verdict: %s (%s)", rollout.mode.capitalize(), action, why)
        if action == "promote":
            return seen
        self._end_rollout()
        entry = {**summary, "rollout": seen, "reason": f"{rollout.mode}: {why}"}
        if action == "keep":
            self.record(context, {"action": "kept_champion", "owner": app_owner(previous_app), **entry})
            raise AirflowSkipException(f"kept champion {summary['champion_version']}: {rollout.mode}: {why}")
        self.record(context, {"action": "rolled_back", "error": why, "owner": app_owner(previous_app), **entry})
        raise ServeModelRejectedError(f"the {rollout.mode} of {model['model_version']} was rolled back and "
                                      f"{summary['champion_version']} serves alone: {why}")

    def _watch(self, rollout: Rollout, version: str, champion_version: str, started_at: str) -> dict[str, Any] | None:
        """Read ``/rollout`` until the rollout has seen enough or its time is up; the last answer.

        What it sees is kept for the page (``serve_history.trial_uri``): from the start (nothing seen
        yet), at its first answer, then every ``TRIAL_RECORD_EVERY_S``."""
        deadline = time.monotonic() + self.ready_timeout_s
        record = {"mode": rollout.mode, "share": rollout.traffic_share, "challenger_version": version,
                  "champion_version": champion_version, "started_at": started_at, "rows_wanted": rollout.rows,
                  "ends_by": None}
        self._record_trial(record, {})
        stats = None
        while stats is None:  # the challenger's replica starts and loads its model
            if time.monotonic() > deadline:
                raise ServeDeployError(f"the challenger {version} did not start within {self.ready_timeout_s:g} s")
            app = self.live_app(self.serve_state()) or {}
            if app.get("status") in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise ServeModelRejectedError(f"application {self.app_name!r} is {app.get('status')}: "
                                              f"{str(app.get('message', ''))[-800:]}")
            stats = self._rollout_stats(version) if app.get("status") == "RUNNING" else None
            if stats is None:
                time.sleep(POLL_S)
        ends = time.monotonic() + rollout.timeout_s
        record["ends_by"] = (datetime.now(timezone.utc) + timedelta(seconds=rollout.timeout_s)).isoformat(
            timespec="seconds")
        recorded = 0.0
        while True:
            if time.monotonic() - recorded >= TRIAL_RECORD_EVERY_S:
                recorded = time.monotonic()
                self._record_trial(record, stats)
            if rollout.done(stats) or time.monotonic() >= ends:
                return stats
            time.sleep(POLL_S)
            stats = self._rollout_stats(version) or stats

    def _record_trial(self, record: dict[str, Any], stats: dict[str, Any]) -> None:
        """Keep what the trial has seen so far for the page; a store that refuses it only costs the page."""
        try:
            artifacts.write_json_atomic(trial_uri(self.serving_dir),
                                        {**record, "updated_at": now_iso(), "stats": seen_stats(stats)})
        except Exception as err:
            self.log.warning("Could not keep the trial's progress for the page (%s): %s", trial_uri(self.serving_dir), err)

    def _rollout_stats(self, version: str, rows: bool = False) -> dict[str, Any] | None:
        """The application's ``/rollout`` answer about ``version``; None while it is not the one running."""
        response = self.hook.get_endpoint_rollout(self.route_prefix, api_key=self.api_key, rows=rows)
        if response.status_code != 200:
            return None
        stats = response.json()
        return stats if stats.get("challenger_version") == version else None

    def _live_metrics(self, rollout: Rollout, stats: dict[str, Any], model: dict[str, Any],
                      metric: str) -> dict[str, Any] | None:
        """Both models' metric on the mirrored rows the label file labels (None without one)."""
        if not rollout.labels or rollout.mode != "shadow":
            return None
        from airflow_ray_ml_stages.preprocessor import Preprocessor
        from airflow_ray_ml_stages.tables import read_table

        preprocessor = Preprocessor.load(artifacts.join(model["model_dir"], "preprocessor.json"))
        kept = self._rollout_stats(model["model_version"], rows=True) or stats
        return live_metrics(kept, read_table(rollout.labels), preprocessor.label_column,
                            list(preprocessor.input_columns), list(preprocessor.boolean_columns),
                            model.get("classes"), metric)

    def on_kill(self) -> None:
        """A task killed during a live trial takes the challenger out: the champion serves alone."""
        if getattr(self, "_trial_running", False):
            self._end_rollout()

    def _end_rollout(self) -> None:
        """Serve the champion alone again: this application's live config without the challenger,
        waited for until the application routes nothing to it."""
        app = self.live_app(self.serve_state()) or {}
        config = app.get("deployed_app_config")
        if not config:
            return
        self._put_app(without_rollout(config))
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.hook.get_endpoint_rollout(self.route_prefix, api_key=self.api_key).status_code == 404:
                return
            time.sleep(READY_POLL_S)
        raise ServeDeployError(f"application {self.app_name!r} still routes to its challenger "
                               f"{self.ready_timeout_s:g} s after it was taken out")

    def _promote(self, context: Context, model: dict[str, Any], compute: dict[str, Any], dag_id: str,
                 summary: dict[str, Any]) -> dict[str, Any]:
        """Serve ``model`` alone, check that it answers, and record the promotion; restore the previous config on failure."""
        previous = artifacts.read_json(previous_config_uri(self.serving_dir))
        live_instance = (previous.get("config") or None) and {
            key: value for key, value in previous["config"].items() if key != "applications"}
        previous_app = next((app for app in (previous.get("config") or {}).get("applications") or []
                             if app.get("name") == self.app_name), None)
        champion_version = summary.get("champion_version")
        self.log.info("Promoting %s (%s); previous config kept in %s", model["model_version"], summary["reason"],
                      previous_config_uri(self.serving_dir))
        ownership = {"owner": dag_id, "previous_owner": app_owner(previous_app)}
        try:
            config = self._put_app(self.app_config(model, compute, dag_id))
            self.wait_for_version(model["model_version"], time.monotonic() + self.ready_timeout_s)
            rows, _, _ = self._test_rows()
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
        self._keep_run(context, model["model_version"])
        self.record(context, {"action": "promoted", **ownership, **summary})
        self.log.info("Serving %s at %s", model["model_version"], self.endpoint)
        self._publish_assets(context, model)
        return {"action": "promoted", "endpoint": self.endpoint, "model_version": model["model_version"], **summary}

    def _keep_run(self, context: Context, version: str) -> None:
        """Keep the run that promoted ``version`` with it: its DAG, run id and Params as resolved (a
        drift-started retraining runs that DAG again with them: the same source, label and settings)."""
        given = context.get("params") or {}
        params = {key: given[key] for key in given}  # resolved values (a ParamsDict's items are Params)
        artifacts.write_json_atomic(run_record_uri(self.serving_dir, version),
                                    {"dag_id": context["ti"].dag_id, "run_id": context["run_id"], "params": params})

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
