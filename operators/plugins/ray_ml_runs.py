"""What the "Ray ML" page reads from Airflow's metadata database: Tune runs and stage jobs.

Everything here is looked up within the DAGs a user may read (``readable_dag_ids``, asked of
Airflow's configured auth manager), by indexed columns (XCom key, DAG, run, task); XCom values
are decoded only for the rows a page shows.

- A Tune run is a successful task instance that pushed a ``leaderboard_json_uri`` XCom (the
  RayTune operator pushes each manifest key as an XCom of its own), or a failed one whose
  ``failure`` XCom (recorded by ``decision_notes`` when the task failed) names the ``tune`` stage,
  with its error. ``list_tune_runs`` lists both, newest first; a page selects one by its selector
  ``<dag_id>/<run_id>/<task_id>/<map_index>``.
- A stage job is a task that pushed a ``ray_job`` XCom (every stage operator records the Ray job
  it submitted or attached to). ``find_stage_job`` accepts a submission id only when such an XCom
  in a readable DAG names it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow_ray_ml.job_status import dag_prefix, is_task_runs_id
from airflow_ray_ml.links.ray import RAY_JOB_XCOM_KEY
from airflow_ray_ml.plugins.decision_notes import FAILURE_XCOM_KEY
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import WAITING_NAME

LEADERBOARD_KEY = "leaderboard_json_uri"
# The picker lists this many runs; an older one is still reachable by its selector.
TUNE_RUN_LIMIT = 50
TUNE_STAGE = "tune"  # the stage a failed task's record names (TuneSpec.stage)
# Failure records are read (newest first) up to this many per listing, to find the failed Tune runs
# among the failures of other stages.
FAILURE_SCAN_LIMIT = 10 * TUNE_RUN_LIMIT
# Airflow's own id rules: DAG and task ids never hold "/", so a run id with one still parses.
_ID = r"[A-Za-z0-9_.~:+@-]+"
_SELECTOR = re.compile(rf"(?P<dag_id>{_ID})/(?P<run_id>.+)/(?P<task_id>{_ID})/(?P<map_index>-1|\d{{1,6}})")
_SUBMISSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_ATTEMPT_SUFFIX = re.compile(r"-r\d+$")


class SelectorError(ValueError):
    """A Tune run selector that is not ``<dag_id>/<run_id>/<task_id>/<map_index>``."""


def readable_dag_ids(user: Any) -> set[str]:
    """The DAGs ``user`` (the auth manager's user object) may read, as Airflow's auth manager says."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


@dataclass
class _Row:
    """What ``XComModel.deserialize_value`` reads from a result row."""

    value: Any


def decode_xcom(value: Any) -> Any:
    """An XCom value as stored, decoded as Airflow decodes it (None when it cannot be)."""
    from airflow.models.xcom import XComModel

    try:
        return XComModel.deserialize_value(_Row(value))
    except Exception:
        try:
            return json.loads(value) if isinstance(value, (str, bytes)) else value
        except ValueError:
            return None


def _timestamp(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)


# -- Tune runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneRunRef:
    """One Tune task's run: which it is, when it pushed its leaderboard (or failed), and, for a
    failed run, its error."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    pushed_at: str = ""
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def selector(self) -> str:
        return f"{self.dag_id}/{self.run_id}/{self.task_id}/{self.map_index}"

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.dag_id, self.run_id, self.task_id, self.map_index


def parse_selector(text: str) -> TuneRunRef:
    """``<dag_id>/<run_id>/<task_id>/<map_index>`` as a reference; SelectorError names the shape."""
    match = _SELECTOR.fullmatch(text or "")
    if match is None:
        raise SelectorError(f"tune must be <dag_id>/<run_id>/<task_id>/<map_index> (map index -1 when the "
                            f"task is not mapped), got {text[:200]!r}")
    return TuneRunRef(match["dag_id"], match["run_id"], match["task_id"], int(match["map_index"]))


@dataclass
class TuneRun:
    """A Tune run as the page shows it: its manifest, Ray job link and leaderboard rows."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    pushed_at: str
    result: dict[str, Any]
    job_url: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    leaderboard_error: str | None = None
    # a failed run: the error's first line and the fix it names (no manifest, no leaderboard)
    error: str | None = None
    fix: str | None = None

    @property
    def selector(self) -> str:
        return TuneRunRef(self.dag_id, self.run_id, self.task_id, self.map_index).selector


def _task_xcoms_query(dag_ids: set[str], key: str = LEADERBOARD_KEY, state: str = "success"):
    """XComs ``key`` of the task instances in ``dag_ids`` that ended in ``state``, newest first: the
    leaderboards of successful Tune runs, (``FAILURE_XCOM_KEY``, ``"failed"``) the failure records
    of failed tasks of any stage, or (``DRIFT_XCOM_KEY``) the drift reports of scoring tasks."""
    from sqlalchemy import and_, select

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.state import TaskInstanceState

    return (
        select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index,
               XComModel.timestamp, XComModel.value)
        .join(TaskInstance, and_(TaskInstance.dag_id == XComModel.dag_id,
                                 TaskInstance.run_id == XComModel.run_id,
                                 TaskInstance.task_id == XComModel.task_id,
                                 TaskInstance.map_index == XComModel.map_index))
        .where(XComModel.key == key, XComModel.dag_id.in_(sorted(dag_ids)),
               TaskInstance.state == TaskInstanceState(state))
        .order_by(XComModel.timestamp.desc())
    )


def _failed_tune_query(dag_ids: set[str]):
    return _task_xcoms_query(dag_ids, FAILURE_XCOM_KEY, "failed")


def _tune_failure(raw: Any) -> dict[str, Any] | None:
    """A failure record of the tune stage with its error, else None."""
    record = decode_xcom(raw)
    if isinstance(record, dict) and record.get("stage") == TUNE_STAGE and isinstance(record.get("error"), str):
        return record
    return None


def list_tune_runs(session, dag_ids: set[str], limit: int = TUNE_RUN_LIMIT) -> list[TuneRunRef]:
    """The successful and the failed Tune runs in ``dag_ids``, newest first, at most ``limit``.

    A row whose value is not a text URI (another task pushing the same key) is left out.
    """
    if not dag_ids:
        return []
    runs = []
    for dag_id, run_id, task_id, map_index, timestamp, raw in session.execute(_task_xcoms_query(dag_ids).limit(limit)):
        uri = decode_xcom(raw)
        if isinstance(uri, str) and uri:
            runs.append(TuneRunRef(dag_id, run_id, task_id, map_index, _timestamp(timestamp)))
    failures = session.execute(_failed_tune_query(dag_ids).limit(FAILURE_SCAN_LIMIT))
    for dag_id, run_id, task_id, map_index, timestamp, raw in failures:
        record = _tune_failure(raw)
        if record is not None:
            runs.append(TuneRunRef(dag_id, run_id, task_id, map_index, _timestamp(timestamp), record["error"]))
    return sorted(runs, key=lambda run: run.pushed_at, reverse=True)[:limit]


def load_tune_run(session, dag_ids: set[str], ref: TuneRunRef) -> TuneRun | None:
    """The Tune run ``ref`` with its manifest and Ray job link (a failed one with its error); None
    unless it is a Tune run of a DAG in ``dag_ids`` (a DAG the user may not read looks exactly like
    a missing run)."""
    from airflow.models.xcom import XCOM_RETURN_KEY, XComModel

    if ref.dag_id not in dag_ids:
        return None
    query = _task_xcoms_query({ref.dag_id}).where(XComModel.run_id == ref.run_id, XComModel.task_id == ref.task_id,
                                            XComModel.map_index == ref.map_index)
    found = session.execute(query.limit(1)).first()
    uri = decode_xcom(found.value) if found else None
    if not isinstance(uri, str) or not uri:
        return _load_failed_tune_run(session, ref)
    values = _xcom_values(session, ref, (XCOM_RETURN_KEY, RAY_JOB_XCOM_KEY))
    manifest, job = values.get(XCOM_RETURN_KEY), values.get(RAY_JOB_XCOM_KEY)
    return TuneRun(
        dag_id=ref.dag_id, run_id=ref.run_id, task_id=ref.task_id, map_index=ref.map_index,
        pushed_at=_timestamp(found.timestamp),
        result={**(manifest if isinstance(manifest, dict) else {}), LEADERBOARD_KEY: uri},
        job_url=job.get("job_url") if isinstance(job, dict) else None,
    )


def _load_failed_tune_run(session, ref: TuneRunRef) -> TuneRun | None:
    """The failed Tune run ``ref`` with its error and Ray job link; None unless it is one (the caller checks access)."""
    from airflow.models.xcom import XComModel

    query = _failed_tune_query({ref.dag_id}).where(XComModel.run_id == ref.run_id, XComModel.task_id == ref.task_id,
                                                   XComModel.map_index == ref.map_index)
    found = session.execute(query.limit(1)).first()
    record = _tune_failure(found.value) if found else None
    if record is None:
        return None
    job = _xcom_values(session, ref, (RAY_JOB_XCOM_KEY,)).get(RAY_JOB_XCOM_KEY)
    return TuneRun(
        dag_id=ref.dag_id, run_id=ref.run_id, task_id=ref.task_id, map_index=ref.map_index,
        pushed_at=_timestamp(found.timestamp), result={},
        job_url=job.get("job_url") if isinstance(job, dict) else None,
        error=record["error"], fix=record.get("fix") if isinstance(record.get("fix"), str) else None,
    )


def _xcom_values(session, ref: TuneRunRef, keys: tuple[str, ...]) -> dict[str, Any]:
    """The XComs ``keys`` of the task instance ``ref`` names (any task's, not only a Tune task's)."""
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    rows = session.execute(
        select(XComModel.key, XComModel.value).where(
            XComModel.dag_id == ref.dag_id, XComModel.run_id == ref.run_id, XComModel.task_id == ref.task_id,
            XComModel.map_index == ref.map_index, XComModel.key.in_(keys))
    )
    return {key: decode_xcom(value) for key, value in rows}


def read_leaderboard(uri: str) -> list[dict[str, Any]]:
    """The leaderboard rows (best first); a clear error when the file is not a list of rows."""
    rows = artifacts.read_json(uri)
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"leaderboard {uri!r} is not a JSON list of rows")
    return rows


# -- stage jobs -----------------------------------------------------------------------------------


@dataclass
class StageJob:
    """The Ray job a stage task recorded (its ``ray_job`` XCom), and what Ray says of it now."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    submission_id: str
    job_url: str | None = None
    status: str | None = None
    message: str = ""


def _stage_job(dag_id: str, run_id: str, task_id: str, map_index: int, value: Any) -> StageJob | None:
    if not isinstance(value, dict) or not isinstance(value.get("submission_id"), str):
        return None
    return StageJob(dag_id, run_id, task_id, map_index, value["submission_id"],
                    job_url=value.get("job_url") if isinstance(value.get("job_url"), str) else None)


def stage_jobs(session, dag_id: str, run_id: str) -> list[StageJob]:
    """The Ray jobs the tasks of one DAG run recorded, in task order (the caller checks DAG access)."""
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    rows = session.execute(
        select(XComModel.task_id, XComModel.map_index, XComModel.value, XComModel.timestamp)
        .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == RAY_JOB_XCOM_KEY)
        .order_by(XComModel.timestamp, XComModel.task_id, XComModel.map_index)
    ).all()
    jobs = (_stage_job(dag_id, run_id, task_id, map_index, decode_xcom(value)) for task_id, map_index, value, _ in rows)
    return [job for job in jobs if job is not None]


def mark_pending(job: StageJob, root: str | None) -> None:
    """Show a running job whose trials or workers wait for the cluster's resources as ``PENDING``, with why.

    The stage says so in its ``waiting.json`` beside the manifest (``root``: the connection's
    artifact root; None: the operators' default).
    """
    if job.status != "RUNNING":
        return
    from airflow_ray_ml.ray_job import DEFAULT_ARTIFACT_ROOT

    root = root or DEFAULT_ARTIFACT_ROOT
    try:
        uri = artifacts.join(artifacts.run_dir(root, job.dag_id, job.run_id, job.task_id, job.map_index), WAITING_NAME)
        waiting = artifacts.read_json(uri)
    except Exception:  # no file: nothing waits
        return
    if isinstance(waiting, dict) and waiting.get("state") == "pending":
        job.status = "PENDING"
        job.message = f"{waiting.get('what') or 'work'} pending: {str(waiting.get('reason') or '')[:1000]}"


def valid_submission_id(submission_id: str) -> bool:
    return bool(_SUBMISSION_ID.fullmatch(submission_id or ""))


def find_stage_job(session, dag_ids: set[str], submission_id: str) -> StageJob | None:
    """The stage job ``submission_id`` if a ``ray_job`` XCom of a DAG in ``dag_ids`` names it, else None.

    Submission ids are ``base_submission_id(dag, run, task, map_index, name)`` (plus ``-rN`` for a
    later attempt), which starts with the DAG's slug and ends with a hash of the four ids: the DAGs are
    narrowed by the slug, the XCom rows (keys only) by the hash, and only the matching row's value
    is decoded and must name this very id.
    """
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    if not dag_ids or not valid_submission_id(submission_id):
        return None
    base = _ATTEMPT_SUFFIX.sub("", submission_id)
    candidates = sorted(dag_id for dag_id in dag_ids if base.startswith(dag_prefix(dag_id)))
    if not candidates:
        return None
    keys = session.execute(
        select(XComModel.dag_id, XComModel.run_id, XComModel.task_id, XComModel.map_index)
        .where(XComModel.key == RAY_JOB_XCOM_KEY, XComModel.dag_id.in_(candidates))
    ).all()
    for dag_id, run_id, task_id, map_index in keys:
        if not is_task_runs_id(base, dag_id, run_id, task_id, map_index):
            continue
        ref = TuneRunRef(dag_id, run_id, task_id, map_index)
        job = _stage_job(dag_id, run_id, task_id, map_index, _xcom_values(session, ref, (RAY_JOB_XCOM_KEY,))
                         .get(RAY_JOB_XCOM_KEY))
        if job is not None and job.submission_id == submission_id:
            return job
    return None


# -- drift of scored files ------------------------------------------------------------------------

DRIFT_XCOM_KEY = "drift"  # the score stage's manifest key (ScoreResult.drift), an XCom of its own
DRIFT_RUN_LIMIT = 200
# Columns named per scoring run on the page: the worst ones.
DRIFT_COLUMNS_SHOWN = 5


@dataclass(frozen=True)
class DriftRun:
    """One scoring task's drift report: which run, which model and file, the verdict, the worst columns."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    pushed_at: str
    model_version: str
    input_uri: str
    verdict: str
    reason: str
    columns: tuple[tuple[str, float, str], ...]  # (column, PSI, verdict), worst first
    report_uri: str


def _drift_run(dag_id: str, run_id: str, task_id: str, map_index: int, timestamp: Any, raw: Any) -> DriftRun | None:
    report = decode_xcom(raw)
    if not isinstance(report, dict) or not isinstance(report.get("verdict"), str):
        return None
    entries = report.get("columns") if isinstance(report.get("columns"), dict) else {}
    ranked = sorted(((str(column), float(entry["psi"]), str(entry.get("verdict", "")))
                     for column, entry in entries.items()
                     if isinstance(entry, dict) and isinstance(entry.get("psi"), (int, float))),
                    key=lambda item: -item[1])
    return DriftRun(dag_id, run_id, task_id, map_index, _timestamp(timestamp), str(report.get("model_version") or ""),
                    str(report.get("input_uri") or ""), report["verdict"], str(report.get("reason") or ""),
                    tuple(ranked[:DRIFT_COLUMNS_SHOWN]), str(report.get("report_uri") or ""))


def list_drift_runs(session, dag_ids: set[str], limit: int = DRIFT_RUN_LIMIT) -> list[DriftRun]:
    """The drift reports of the successful scoring tasks in ``dag_ids``, newest first, at most ``limit``."""
    if not dag_ids:
        return []
    rows = session.execute(_task_xcoms_query(dag_ids, DRIFT_XCOM_KEY).limit(limit))
    return [run for run in (_drift_run(*row) for row in rows) if run is not None]
