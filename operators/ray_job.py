"""The job-submitting core shared by every stage operator, and the operator for Ray jobs of your own.

An operator never preprocesses, trains or serves inside the Airflow worker. It builds a stage spec,
runs ``python -m airflow_ray_ml_stages.<stage> --spec '<json>'`` as a Ray job with the Ray-side
package shipped in the job's ``runtime_env`` (or, given an ``entrypoint``, runs that command),
follows the job (streaming its log into the task log line by line as the job writes it, from the
worker or, deferred, from :class:`~airflow_ray_ml.triggers.ray.RayJobTrigger`), and returns the
job's result manifest as the XCom (each of its keys also as an XCom of its own, for
``task.output["key"]``); a job of your own returns its manifest if it wrote one
(:mod:`airflow_ray_ml_stages.job_result`), else the last JSON line it printed.

Every try of one task run uses the same deterministic submission id, so a retried task re-attaches
to a RUNNING job, reuses a SUCCEEDED job's manifest, and submits a new job (``-r1``, ``-r2``...)
only after the previous one FAILED or was STOPPED.
"""

from __future__ import annotations

import json
import shlex
import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator

import airflow_ray_ml_stages
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.capacity import ResourceRequest, check_request
from airflow_ray_ml_stages.constants import ARTIFACT_DIR_ENV, JOB_ENV_VARS, MANIFEST_LOG_MARKER, STATUS_SUCCEEDED
from airflow_ray_ml_stages.errors import RayMLError
from airflow_ray_ml.compat import TaskDeferralTimeout, conf
from airflow_ray_ml.contract import coerce_spec
from airflow_ray_ml.errors import (
    InvalidSpecError, RayAuthError, RayClusterUnreachableError, RayJobFailedError, RayJobTimeoutError, RayManifestError,
    RayOperatorError, RayResourcesError, RayStageError,
)
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import Action, Decision, RayJobStatus, attempt_id, base_submission_id, decide
from airflow_ray_ml.links.ray import RAY_JOB_XCOM_KEY, RayJobLink, RayJobLogLink, job_page_url
from airflow_ray_ml.triggers.ray import RayJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

DEFAULT_ARTIFACT_ROOT = str(Path.home() / "airflow-ray-ml" / "artifacts")
RAYML_PACKAGE_DIR = str(Path(airflow_ray_ml_stages.__file__).resolve().parent)


def manifest_from_log(log_text: str) -> dict[str, Any] | None:
    """The manifest a stage repeated on its marked log line (the last one wins), if any."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(MANIFEST_LOG_MARKER):
            try:
                return json.loads(line[len(MANIFEST_LOG_MARKER) :])
            except json.JSONDecodeError:
                return None
    return None


def last_json_line(log_text: str) -> Any:
    """The last line of a job's log that is a JSON object or list (None if there is none)."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if line[:1] in ("{", "[") and not line.startswith(MANIFEST_LOG_MARKER):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


class RayJobOperator(BaseOperator):
    """Run a Ray job and return its result as the XCom: a Ray-side stage, or any command of yours.

    Given ``stage``, it runs ``airflow_ray_ml_stages.<stage>`` with ``spec`` and returns the stage's
    manifest (stage operators subclass it and override :meth:`build_spec`). Given ``entrypoint``,
    it runs that command; the job's XCom is the manifest the job wrote with
    :func:`airflow_ray_ml_stages.job_result.report_result` if it did, else the last line it printed
    that is a JSON object or list, else None. Either way: one deterministic submission id per task
    run (a retry re-attaches to a running job), the job's log streamed into the task log, deferral,
    and ``on_kill`` stopping the job.

    :param stage: the stage module under ``airflow_ray_ml_stages`` (for example ``generate``). (templated)
    :param spec: the stage's spec fields other than ``artifact_dir``, which the operator sets to
        this task run's directory. (templated)
    :param entrypoint: instead of a stage, the shell command the job runs, such as
        ``python train.py --epochs 3`` with ``runtime_env={"working_dir": ...}``; the job finds its
        task run's artifact directory in ``RAYML_ARTIFACT_DIR``. (templated)
    :param entrypoint_num_cpus: CPUs reserved for the entrypoint's process (Ray's default: 0).
    :param entrypoint_num_gpus: GPUs reserved for the entrypoint's process.
    :param entrypoint_memory: bytes of memory reserved for the entrypoint's process.
    :param entrypoint_resources: custom resources reserved for the entrypoint's process.
    :param metadata: more job metadata for the Ray dashboard (text values); the operator's own
        ``airflow_*`` keys (DAG, run, task, map index) are always set. (templated)
    :param job_name: a word for the job's id in Ray, after the DAG's (the pipeline gives the label
        column, so a team's jobs read ``airflow-<dag>-<label>-<task>-<hash>``); None: none. (templated)
    :param ray_conn_id: the Airflow connection to the Ray cluster (type ``ray_ml``).
    :param artifact_root: where stages write outputs; default: the connection's artifact root, else
        ``RAYML_ARTIFACT_ROOT``, else ``~/airflow-ray-ml/artifacts``. (templated)
    :param runtime_env: extra Ray ``runtime_env`` entries merged into the job's (templated).
    :param ship_package: upload the Ray-side package with the job; turn off when the cluster image
        already has it installed.
    :param deferrable: wait in the triggerer instead of holding a worker slot; default: Airflow's
        ``[operators] default_deferrable``. Either way the job's log lines reach the task log as
        the job writes them.
    :param poll_interval_s: seconds between looks at the job's state while its log streams (the
        task ends this soon after the job), and between tries while the stream cannot be read.
    :param job_timeout_s: stop the job and fail the task after this long.
    """

    template_fields: Sequence[str] = ("stage", "spec", "entrypoint", "artifact_root", "runtime_env", "metadata",
                                      "job_name")
    template_fields_renderers = {"spec": "json", "runtime_env": "json", "metadata": "json"}
    operator_extra_links = (RayJobLink(), RayJobLogLink())
    ui_color = "#e6f0ff"

    def __init__(
        self,
        *,
        stage: str | None = None,
        spec: dict[str, Any] | None = None,
        entrypoint: str | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        metadata: dict[str, str] | None = None,
        job_name: str | None = None,
        ray_conn_id: str = RayHook.default_conn_name,
        artifact_root: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        ship_package: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval_s: float = 1.0,
        job_timeout_s: float | None = 6 * 3600,
        **kwargs: Any,
    ) -> None:
        if (stage is None) == (entrypoint is None):
            raise ValueError(f"task {kwargs.get('task_id')!r}: give RayJobOperator either stage= (one of this "
                             "package's stages) or entrypoint= (a command of your own), not both or neither")
        if spec and entrypoint is not None:
            raise ValueError(f"task {kwargs.get('task_id')!r}: spec= goes with stage=; pass a command's "
                             "arguments in its entrypoint")
        # each manifest key of a stage is an XCom of its own too, so a DAG hands on exactly what the next
        # task takes: `config=tune.output["best_config"]`, `source=demo_data.output["data_uris"]`. A
        # command's result may be any JSON, so it stays one XCom unless the DAG asks otherwise.
        kwargs.setdefault("multiple_outputs", stage is not None)
        super().__init__(**kwargs)
        self.stage = stage
        self.spec = spec or {}
        self.entrypoint = entrypoint
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_num_gpus = entrypoint_num_gpus
        self.entrypoint_memory = entrypoint_memory
        self.entrypoint_resources = entrypoint_resources
        self.metadata = metadata or {}
        self.job_name = job_name
        self.ray_conn_id = ray_conn_id
        self.artifact_root = artifact_root
        self.runtime_env = runtime_env or {}
        self.ship_package = ship_package
        self.deferrable = deferrable
        self.poll_interval_s = poll_interval_s
        self.job_timeout_s = job_timeout_s
        self._submission_id: str | None = None
        # what this task run's job ran with and returned: the datasets it reports to OpenLineage
        self._spec: dict[str, Any] | None = None
        self._manifest: dict[str, Any] | None = None

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(self.ray_conn_id)

    # -- what subclasses customise -------------------------------------------------------------

    def build_spec(self, context: Context) -> dict[str, Any]:
        """The stage spec's fields (without ``artifact_dir``). Stage operators override this."""
        return dict(self.spec)

    # -- ids and places ------------------------------------------------------------------------

    @staticmethod
    def _run_keys(context: Context) -> tuple[str, str, int]:
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        return ti.dag_id, context["run_id"], -1 if map_index is None else map_index

    def base_submission_id(self, context: Context) -> str:
        dag_id, run_id, map_index = self._run_keys(context)
        return base_submission_id(dag_id, run_id, self.task_id, map_index, name=self.job_name or None)

    def artifact_dir(self, context: Context) -> str:
        root = self.artifact_root or self.hook.artifact_root or DEFAULT_ARTIFACT_ROOT
        dag_id, run_id, map_index = self._run_keys(context)
        return artifacts.run_dir(root, dag_id, run_id, self.task_id, map_index)

    def job_runtime_env(self, artifact_dir: str | None = None) -> dict[str, Any]:
        runtime_env = dict(self.runtime_env)
        own = {ARTIFACT_DIR_ENV: artifact_dir} if artifact_dir else {}
        runtime_env["env_vars"] = {**JOB_ENV_VARS, **own, **runtime_env.get("env_vars", {})}
        if self.ship_package:
            runtime_env["py_modules"] = [RAYML_PACKAGE_DIR, *runtime_env.get("py_modules", [])]
        return runtime_env

    def stage_command(self, spec: dict[str, Any]) -> str:
        # The stage was checked against the known stages (full_spec); quoting keeps it one word anyway.
        module = shlex.quote(f"airflow_ray_ml_stages.{self.stage}")
        return f"python -m {module} --spec {shlex.quote(json.dumps(spec, sort_keys=True))}"

    def full_spec(self, context: Context) -> dict[str, Any]:
        """The stage's whole spec, validated in Airflow before any job starts.

        ``stage`` is a template field, so it may come from a run's conf: only a known stage name
        reaches the job's command line.
        """
        spec_types = _spec_types()
        spec_type = spec_types.get(self.stage) if isinstance(self.stage, str) else None
        if spec_type is None:
            raise InvalidSpecError(
                f"task {self.task_id!r}: unknown stage {self.stage!r}; it must be one of {sorted(spec_types)}"
            )
        # values a template rendered as text take their field's type here, once (airflow_ray_ml.contract)
        spec = coerce_spec(spec_type, {**self.build_spec(context), "artifact_dir": self.artifact_dir(context)})
        try:
            spec_type.from_dict(spec)
        except RayMLError as err:
            raise InvalidSpecError(f"task {self.task_id!r}: invalid {self.stage} spec: {err}") from None
        self._spec = spec
        return spec

    # -- the job's life ------------------------------------------------------------------------

    def existing_attempts(self, base_id: str) -> dict[str, RayJobStatus]:
        found: dict[str, RayJobStatus] = {}
        attempt = 0
        while (status := self.hook.get_job_status(attempt_id(base_id, attempt))) is not None:
            found[attempt_id(base_id, attempt)] = status
            attempt += 1
        return found

    def decide(self, context: Context) -> Decision:
        base_id = self.base_submission_id(context)
        return decide(base_id, self.existing_attempts(base_id))

    def _record_job(self, context: Context, submission_id: str) -> None:
        self._submission_id = submission_id
        url = job_page_url(self.hook.dashboard_url, submission_id)
        context["ti"].xcom_push(
            key=RAY_JOB_XCOM_KEY,
            value={"dashboard_url": self.hook.dashboard_url, "submission_id": submission_id, "job_url": url},
        )

    def job_entrypoint(self, spec: dict[str, Any] | None) -> str:
        """The job's command: the stage's, or the ``entrypoint`` given."""
        if spec is None:
            if not isinstance(self.entrypoint, str) or not self.entrypoint.strip():
                raise InvalidSpecError(f"task {self.task_id!r}: entrypoint must be a command, got {self.entrypoint!r}")
            return self.entrypoint
        return self.stage_command(spec)

    def resource_requests(self, spec: dict[str, Any] | None) -> list[ResourceRequest]:
        """What the job will ask the cluster for, to check before submitting: here the entrypoint's
        own reservation; stage operators add their workers or trials."""
        cpus, gpus = self.entrypoint_num_cpus or 0, self.entrypoint_num_gpus or 0
        custom = {name: amount for name, amount in (self.entrypoint_resources or {}).items() if amount}
        if not (cpus or gpus or custom):
            return []
        return [ResourceRequest(what="entrypoint", count=1, cpus=float(cpus), gpus=float(gpus), custom=custom,
                                setting="entrypoint_num_cpus / entrypoint_num_gpus / entrypoint_resources")]

    def check_resources(self, spec: dict[str, Any] | None) -> None:
        """Fail at once when the cluster can never meet the job's requests (a static cluster's nodes);
        what is possible but busy, or may come from an autoscaler, is left to wait."""
        requests = self.resource_requests(spec)
        if not requests:
            return
        capacity = self.hook.get_capacity()
        for request in requests:
            problem = check_request(capacity, request)
            if problem:
                raise RayResourcesError(f"task {self.task_id!r}: {problem}")
        self.log.info("Resource check: %s fit%s the cluster (%g CPU, %g GPU%s)",
                      ", ".join(request.summary() for request in requests), "" if len(requests) > 1 else "s",
                      capacity.total_cpus, capacity.total_gpus,
                      "; an autoscaler may add nodes" if capacity.autoscaling else "")

    def submit(self, context: Context, submission_id: str, spec: dict[str, Any] | None, artifact_dir: str) -> Decision:
        dag_id, run_id, map_index = self._run_keys(context)
        resources = {"entrypoint_num_cpus": self.entrypoint_num_cpus, "entrypoint_num_gpus": self.entrypoint_num_gpus,
                     "entrypoint_memory": self.entrypoint_memory, "entrypoint_resources": self.entrypoint_resources}
        try:
            self.hook.submit_job(
                entrypoint=self.job_entrypoint(spec),
                submission_id=submission_id,
                runtime_env=self.job_runtime_env(artifact_dir),
                metadata={**{str(key): str(value) for key, value in (self.metadata or {}).items()},
                          "airflow_dag_id": dag_id, "airflow_run_id": run_id,
                          "airflow_task_id": self.task_id, "airflow_map_index": str(map_index)},
                **{key: value for key, value in resources.items() if value is not None},
            )
        except RuntimeError as err:
            if "already exists" not in str(err):
                raise RayOperatorError(f"Ray did not accept job {submission_id}: {err}") from None
            # Another try of this task run submitted it first: follow that job instead.
            self.log.info("Ray job %s was submitted concurrently; attaching to it", submission_id)
            return Decision(Action.ATTACH, submission_id)
        self.log.info("Submitted Ray job %s (%s)", submission_id,
                      f"stage {self.stage}" if self.stage is not None else "your entrypoint")
        return Decision(Action.SUBMIT, submission_id)

    def execute(self, context: Context) -> Any:
        spec = self.full_spec(context) if self.stage is not None else None
        artifact_dir = spec["artifact_dir"] if spec else self.artifact_dir(context)
        self.hook.check_access()
        decision = self.decide(context)
        if decision.action is Action.SUBMIT:  # a job already running or done is followed as it is
            self.check_resources(spec)
        self._record_job(context, decision.submission_id)
        self.log.info("Ray job %s: %s; dashboard: %s", decision.submission_id, decision.action.value,
                      job_page_url(self.hook.dashboard_url, decision.submission_id))
        if decision.action is Action.REUSE:
            self.log.info("An earlier try of this task run already succeeded; reusing its manifest")
            return self.finish(decision.submission_id, artifact_dir, log_offset=0)
        if decision.action is Action.SUBMIT:
            decision = self.submit(context, decision.submission_id, spec, artifact_dir)
        if self.deferrable:
            self.defer(
                trigger=RayJobTrigger(
                    submission_id=decision.submission_id,
                    ray_conn_id=self.ray_conn_id,
                    poll_interval_s=self.poll_interval_s,
                ),
                method_name="execute_complete",
                timeout=self.job_timeout_s,
            )
        offset = self.wait(decision.submission_id)
        return self.finish(decision.submission_id, artifact_dir, log_offset=offset)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None, **_: Any) -> Any:
        """Resume after the trigger fired (``event`` may be None where the kwargs were dropped)."""
        event = event or {}
        submission_id = event.get("submission_id") or self.decide(context).submission_id
        self._submission_id = submission_id
        status = self.hook.get_job_status(submission_id)
        if event.get("status") == "error" and (status is None or not status.is_terminal()):
            raise RayJobFailedError(f"waiting for Ray job {submission_id} failed: {event.get('message')}")
        # The trigger logged the job's lines up to log_offset while the task was deferred.
        return self.finish(submission_id, self.artifact_dir(context), log_offset=int(event.get("log_offset") or 0))

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except TaskDeferralTimeout:
            # Airflow cancels a timed-out trigger without calling its on_kill(): stop the job here.
            # (A trigger that failed otherwise leaves the job running, for a retry to attach to.)
            raise self._stop_for_timeout(self.decide(context).submission_id) from None

    def _stop_for_timeout(self, submission_id: str) -> RayJobTimeoutError:
        """Stop a job that outlived ``job_timeout_s``; the error to fail the task with."""
        stopped = self.hook.stop_job(submission_id)
        return RayJobTimeoutError(
            f"Ray job {submission_id} did not finish within job_timeout_s={self.job_timeout_s} s"
            f"{' and was stopped' if stopped else ''}; raise job_timeout_s or give the cluster more resources"
        )

    def _job_logs(self, submission_id: str) -> str:
        try:
            return self.hook.get_job_logs(submission_id)
        except (RayClusterUnreachableError, RayAuthError):
            raise
        except RayOperatorError as err:  # the job's state still decides the task; its log only explains it
            self.log.warning("%s", err)
            return ""

    def _emit_logs(self, text: str) -> None:
        for line in text.splitlines():
            self.log.info("[ray] %s", line)

    def wait(self, submission_id: str) -> int:
        """Log the job's lines as it writes them until it has ended; return how many characters were logged."""
        deadline = None if self.job_timeout_s is None else time.monotonic() + self.job_timeout_s
        offset = 0
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                for line in self.hook.tail_job_logs(submission_id, offset=offset, timeout_s=remaining,
                                                    status_poll_s=self.poll_interval_s):
                    self.log.info("[ray] %s", line.rstrip("\r\n"))
                    offset += len(line)
            except TimeoutError:
                raise self._stop_for_timeout(submission_id) from None
            except RayClusterUnreachableError as err:
                # The job may well run on: its state (next) says, and a new stream resumes at offset.
                self.log.warning("Lost the log stream of Ray job %s: %s", submission_id, err)
            status = self.hook.get_job_status(submission_id)
            if status is None or status.is_terminal():
                return offset
            time.sleep(self.poll_interval_s)

    def read_manifest(self, artifact_dir: str, log_text: str) -> dict[str, Any] | None:
        uri = artifacts.manifest_uri(artifact_dir)
        try:
            return artifacts.read_json(uri)
        except (RayMLError, OSError) as err:
            self.log.info("Manifest %s not readable from this worker (%s); using the job log's copy", uri, err)
        return manifest_from_log(log_text)

    def finish(self, submission_id: str, artifact_dir: str, log_offset: int) -> Any:
        """Log what the job printed after ``log_offset``, then return its result or raise its error."""
        status = self.hook.get_job_status(submission_id)
        logs = self._job_logs(submission_id)  # whole, once: the manifest line and the reason of a failure
        self._emit_logs(logs[log_offset:])
        if self.stage is None:
            return self.command_result(submission_id, status, logs)
        manifest = self.read_manifest(artifact_dir, logs)
        if status is not RayJobStatus.SUCCEEDED:
            # This job's own verdict, from its log: a manifest file may be an earlier try's.
            verdict = manifest_from_log(logs) or {}
            if verdict.get("error") and verdict.get("retryable") is False:
                raise RayStageError(f"stage {self.stage} failed: {verdict['error']} (Ray job {submission_id}; not "
                                    "retried, since another try would fail the same way)")
            reason = (manifest or {}).get("error") or last_lines(logs) or "see the job log above"
            raise RayJobFailedError(
                f"Ray job {submission_id} (stage {self.stage}) ended {status.value if status else 'MISSING'}: {reason}"
            )
        if manifest is None:
            raise RayManifestError(
                f"Ray job {submission_id} succeeded but wrote no readable manifest in {artifact_dir}"
            )
        if manifest.get("status") != STATUS_SUCCEEDED:
            raise RayJobFailedError(f"stage {self.stage} reported failure: {manifest.get('error')}")
        self._manifest = manifest
        return manifest

    def command_result(self, submission_id: str, status: RayJobStatus | None, logs: str) -> Any:
        """A command's XCom: the manifest it wrote (``report_result``), else its last JSON line, else None.

        Where a subclass runs a command of its own (``@task.ray``), it reads its result here.
        """
        if status is not RayJobStatus.SUCCEEDED:
            raise RayJobFailedError(
                f"Ray job {submission_id} ({self.entrypoint!r}) ended {status.value if status else 'MISSING'}: "
                f"{last_lines(logs) or 'see the job log above'}"
            )
        manifest = manifest_from_log(logs)
        if manifest is not None:  # this job's own report, on its marked line; the file says the same
            return manifest
        result = last_json_line(logs)
        if result is None:
            self.log.info("Ray job %s printed no JSON line and reported no result: the XCom is None", submission_id)
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The datasets the job read and wrote, for Airflow's OpenLineage integration (airflow_ray_ml.lineage)."""
        from airflow_ray_ml.lineage import stage_lineage

        spec = self._spec
        if spec is None and self._manifest is not None and self.stage is not None:  # resumed after deferral, in a new operator: build it again
            spec = self.full_spec(task_instance.get_template_context())
        return stage_lineage(self.stage, spec, self._manifest)

    def on_kill(self) -> None:
        if self._submission_id:
            self.log.info("Stopping Ray job %s", self._submission_id)
            self.hook.stop_job(self._submission_id)


def last_lines(log_text: str, count: int = 3) -> str:
    """The job log's last non-empty lines: where a crash before the manifest says what went wrong."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return " | ".join(lines[-count:])


def _spec_types() -> dict[str, type]:
    from airflow_ray_ml_stages import specs

    return {
        cls.stage: cls
        for cls in vars(specs).values()
        if isinstance(cls, type) and issubclass(cls, specs.StageSpec) and cls.stage
    }
