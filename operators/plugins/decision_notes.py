"""Serve decisions and failures as notes: what a deploy decided, or why a task failed, becomes its
task's note and the run's note.

A kept champion leaves its deploy task "skipped", and a failed task leaves only its log; a person
looking at the grid wants to know why without opening the log. Tasks cannot write notes (the Task
SDK has no call for it), so this listener works in two places:

- in the task's own process, when a task fails, it records the error as a ``failure`` XCom: the
  error's first line and the fix the message names (``failure_record``), masked by Airflow's
  secrets masker there, where the task's secrets are known. Only tasks of DAGs that use this
  provider's operators record one; other DAGs are left alone;
- where the metadata database is at hand, when a DAG run finishes (the scheduler, or
  ``dag.test()``), it turns every ``decision`` XCom of the run (pushed by ``RayServeDeployOperator``
  and ``RayServeRollbackOperator`` with the serving history's entry) and every ``failure`` XCom of
  a task that ended failed into the note of that task and, joined, into the run's note;
- when a scoring run finishes, each score task's drift verdict becomes its note and the run's
  ("Drift: drift in alcohol (PSI 0.41); retraining run drift__… started", or "No drift (stable): …");
- in the scheduler, when a run that drift started begins (an event a ``RayBatchScoreOperator``
  emitted on its ``drift_asset``, for a DAG scheduled on it), it writes why as the run's note:
  "Started by drift in alcohol (PSI 0.41), density (0.28) in <the scored file> (model <version>)".
  A retraining that ``DriftRetrainOperator`` triggers comes with such a note. The run's decisions
  and failures are added to a note that begins so when it finishes.

A note a person already wrote is never replaced.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from airflow_ray_ml.ray_score import drift_extras

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 1000  # Airflow's note column holds 1000
FAILURE_XCOM_KEY = "failure"
STARTED_BY = "Started by "  # how the note of a run that drift started begins
# A note quotes this much of an error's first line and of its fix: enough to act on, never a dump
# of the data a message may quote.
MAX_ERROR_CHARS = 400
MAX_FIX_CHARS = 300
# How this project's error messages begin the fix they name ("...; set label_column ...",
# "... . Fix the search space ..."): an imperative verb that starts a sentence or a clause.
FIX_VERBS = (
    "add", "allow", "ask", "change", "check", "choose", "clear", "copy", "create", "define", "delete", "drop",
    "fix", "free", "give", "grant", "increase", "install", "leave", "lower", "make", "move", "pass", "pick",
    "point", "raise", "reduce", "remove", "rename", "restart", "see", "set", "split", "start", "stop", "take",
    "use", "wait", "widen",
)
_FIX_START = re.compile(
    r"(?:^|[.;:!?]\s+|\s[—–-]\s+)(?:(?:please|then|or)\s+)?(?P<verb>(?:%s))\b(?!\s+(?:failed|error))"
    % "|".join(FIX_VERBS), re.IGNORECASE)
# What RayStageError appends to a stage's own message: the job, which the task's links name anyway.
_STAGE_SUFFIX = re.compile(r"\s*\(Ray job [^()]*\)\s*$")


def _metrics(decision: dict[str, Any]) -> str:
    challenger, champion, metric = decision.get("challenger"), decision.get("champion"), decision.get("metric")
    if not isinstance(challenger, (int, float)):
        return ""
    if isinstance(champion, (int, float)):
        return f" (test {metric} {challenger:.4f} vs {champion:.4f})"
    return f" (test {metric} {challenger:.4f})"


def decision_text(decision: dict[str, Any]) -> str:
    """One sentence saying what a deploy or rollback decided, which versions, and why."""
    action = decision.get("action")
    new, old = decision.get("challenger_version"), decision.get("champion_version")
    reason = decision.get("reason") or ""
    if action == "promoted":
        over = f" over {old}" if old else ""
        text = f"Promoted {new}{over}: {reason}"
    elif action == "kept_champion":
        text = f"Kept champion {old}; challenger {new} not promoted: {reason}"
    elif action == "rolled_back":
        text = f"Deploy of {new} failed, {old or 'the previous state'} restored: {decision.get('error', '')}"
    elif action == "rollback":
        text = f"Rolled back from {decision.get('from_version')} to {decision.get('version')}: {reason}"
    elif action == "pinned":
        text = f"Pinned {decision.get('version')} (was {decision.get('from_version')}): {reason}"
    elif action == "rollback_failed":
        text = (f"Serving {decision.get('version')} again failed, {decision.get('from_version')} restored: "
                f"{decision.get('error', '')}")
    else:
        text = f"{action}: {reason}"
    if action in ("promoted", "kept_champion"):
        text += "" if f"{decision.get('metric')} " in reason else _metrics(decision)
    approval = decision.get("approval")
    if action == "promoted" and isinstance(approval, dict) and approval.get("by"):
        text += f"; approved by {approval['by']}" + (f": {approval['reason']}" if approval.get("reason") else "")
    return text[:MAX_NOTE_CHARS]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def error_first_line(error: Any) -> str:
    """The first non-blank line of an error (an exception or its text), without the job suffix."""
    text = str(error) if error is not None else ""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not line and isinstance(error, BaseException):
        line = type(error).__name__
    return _STAGE_SUFFIX.sub("", line)


def named_fix(line: str) -> str | None:
    """The fix an error line names: from the last sentence or clause that starts with an imperative
    verb (``FIX_VERBS``) to the end of the line; None when the line names none."""
    starts = list(_FIX_START.finditer(line))
    if not starts:
        return None
    fix = line[starts[-1].start("verb"):].rstrip(" .")
    return fix[:1].upper() + fix[1:]


def failure_record(error: Any) -> dict[str, Any]:
    """What a failed task records for its note: the error's first line and the fix it names, both cut
    to a bounded length (``MAX_ERROR_CHARS``, ``MAX_FIX_CHARS``), and the exception's type."""
    line = error_first_line(error)
    fix = named_fix(line)
    return {
        "error": _cut(line, MAX_ERROR_CHARS) or "failed without an error message",
        "fix": _cut(fix, MAX_FIX_CHARS) if fix else None,
        "exception": type(error).__name__ if isinstance(error, BaseException) else None,
    }


def failure_text(record: dict[str, Any], subject: str = "") -> str:
    """One sentence saying why a task failed and what to do: the error, then its fix unless quoted whole.

    ``subject`` (a task id) starts the sentence in a run's note, where several tasks may speak.
    """
    error = str(record.get("error") or "failed without an error message")
    fix = record.get("fix")
    text = f"{subject} failed: {error}" if subject else f"Failed: {error}"
    if isinstance(fix, str) and fix and fix.lower() not in error.lower():
        text += f" — {fix}"
    return text[:MAX_NOTE_CHARS]


def started_by_text(extras: list[Any]) -> str | None:
    """Why a run started, from the extras of the asset events it consumed: the drift that scoring
    tasks found (``RayBatchScoreOperator.announce_drift``); None when no event was a drift."""
    reasons = [f"{extra['reason']} in {extra.get('input_uri')} (model {extra.get('model_version')})"
               for extra in drift_extras(extras)]
    return (STARTED_BY + "; ".join(reasons))[:MAX_NOTE_CHARS] if reasons else None


def _started_by(dag_run: Any) -> str | None:
    return started_by_text([event.extra for event in dag_run.consumed_asset_events or []])


def note_start(dag_run: Any, session: Any) -> str | None:
    """Write why a run that drift started began as its note (in ``session``); return the text."""
    text = _started_by(dag_run)
    if text and not dag_run.note:
        dag_run.note = text
    return text


def uses_this_provider(task: Any) -> bool:
    """Whether ``task``'s DAG (or the task alone, outside a DAG) runs any of this provider's operators."""
    dag = getattr(task, "dag", None)
    for member in getattr(dag, "tasks", None) or [task]:
        operator_class = getattr(member, "operator_class", None)  # a mapped task's operator
        module = (operator_class if isinstance(operator_class, type) else type(member)).__module__
        if module.startswith("airflow_ray_ml."):
            return True
    return False


def _task_instance(session: Any, dag_run: Any, task_id: str, map_index: int) -> Any:
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance

    return session.scalar(select(TaskInstance).where(
        TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
        TaskInstance.task_id == task_id, TaskInstance.map_index == map_index))


def _xcoms(session: Any, dag_run: Any, key: str) -> list[tuple[str, int, Any]]:
    """The run's XComs ``key``, decoded, oldest first, as (task id, map index, value)."""
    from sqlalchemy import select

    from airflow.models.xcom import XComModel

    from airflow_ray_ml.plugins.ray_ml_runs import decode_xcom

    rows = session.execute(
        select(XComModel.task_id, XComModel.map_index, XComModel.value).where(
            XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id, XComModel.key == key)
        .order_by(XComModel.timestamp, XComModel.task_id, XComModel.map_index)
    ).all()
    return [(task_id, map_index, decode_xcom(raw)) for task_id, map_index, raw in rows]


def note_decisions(dag_run: Any, session: Any) -> list[str]:
    """Write each decision of the run as its task's note (in ``session``); return the texts."""
    from airflow_ray_ml.serve_history import DECISION_XCOM_KEY

    texts = []
    for task_id, map_index, decision in _xcoms(session, dag_run, DECISION_XCOM_KEY):
        if not isinstance(decision, dict):
            continue
        text = decision_text(decision)
        texts.append(text)
        ti = _task_instance(session, dag_run, task_id, map_index)
        if ti is not None and not ti.note:
            ti.note = text
    return texts


def drift_text(report: dict[str, Any], retraining_run_id: str | None) -> str:
    """One sentence of a scoring task's drift report, and the retraining run it started, if any."""
    verdict = report.get("verdict")
    if verdict == "drift":
        text = f"Drift: {report.get('reason')}"
        text += (f"; retraining run {retraining_run_id} started" if retraining_run_id
                 else "; no retraining started")
    else:
        text = f"No drift ({verdict}): {report.get('reason') or 'no column drifted'}"
    return text[:MAX_NOTE_CHARS]


def note_drift(dag_run: Any, session: Any) -> list[str]:
    """Write each scoring task's drift verdict as its note (in ``session``), naming the retraining run
    the run triggered (a ``DriftRetrainOperator``'s ``trigger_run_id``); return the texts."""
    from airflow.providers.standard.operators.trigger_dagrun import XCOM_RUN_ID

    from airflow_ray_ml.plugins.ray_ml_runs import DRIFT_XCOM_KEY

    reports = _xcoms(session, dag_run, DRIFT_XCOM_KEY)
    if not reports:
        return []
    triggered = [run_id for _, _, run_id in _xcoms(session, dag_run, XCOM_RUN_ID) if run_id]
    texts = []
    for task_id, map_index, report in reports:
        if not isinstance(report, dict) or not report.get("verdict"):
            continue
        text = drift_text(report, triggered[-1] if triggered and report.get("verdict") == "drift" else None)
        texts.append(text)
        ti = _task_instance(session, dag_run, task_id, map_index)
        if ti is not None and not ti.note:
            ti.note = text
    return texts


def note_failures(dag_run: Any, session: Any) -> list[str]:
    """Write why each failed task of the run failed as its note (in ``session``); return the run's sentences.

    Only a task that ended failed counts: a record left by a try that was retried is cleared when
    the next try starts, and a task that failed and was then cleared and succeeded has none.
    """
    from airflow.utils.state import TaskInstanceState

    texts = []
    for task_id, map_index, record in _xcoms(session, dag_run, FAILURE_XCOM_KEY):
        ti = _task_instance(session, dag_run, task_id, map_index)
        if not isinstance(record, dict) or ti is None or ti.state != TaskInstanceState.FAILED:
            continue
        if not ti.note:
            ti.note = failure_text(record)
        texts.append(failure_text(record, task_id if map_index < 0 else f"{task_id}[{map_index}]"))
    return texts


def note_run(dag_run: Any, session: Any) -> list[str]:
    """Write the run's decisions and failures as notes (in ``session``); return the run note's sentences."""
    texts = note_decisions(dag_run, session) + note_drift(dag_run, session) + note_failures(dag_run, session)
    if texts and not dag_run.note:
        dag_run.note = " · ".join(texts)[:MAX_NOTE_CHARS]
    elif texts and dag_run.note.startswith(STARTED_BY):  # our own note of why it started: carry on
        dag_run.note = " · ".join([dag_run.note, *texts])[:MAX_NOTE_CHARS]
    return texts


def _in_session(dag_run: Any, write: Any) -> None:
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is not None:  # the caller's session: it commits the notes with the run's state
        write(dag_run, session)
        return
    from airflow.utils.session import create_session

    with create_session() as own:
        write(own.merge(dag_run), own)


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    try:
        _in_session(dag_run, note_start)
    except Exception as err:  # a missing note never stops a run from starting
        log.warning("Could not note why run %s started: %s", getattr(dag_run, "run_id", "?"), err)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _in_session(dag_run, note_run)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _in_session(dag_run, note_run)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """Record why the task failed, in the task's own process (a try that will be retried too: its
    record is cleared when the next try starts). The scheduler's own calls (a task whose worker was
    lost, one marked failed by hand) have no task process and record nothing."""
    # A task's process has the task runner's module loaded; elsewhere it need not be imported to
    # tell that the task instance is not the runner's.
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    if runner is None or not isinstance(task_instance, runner.RuntimeTaskInstance):
        return
    if not uses_this_provider(task_instance.task):
        return
    from airflow.sdk._shared.secrets_masker import redact

    record = {**redact(failure_record(error)), "stage": getattr(task_instance.task, "stage", None)}
    try:
        task_instance.xcom_push(FAILURE_XCOM_KEY, record)
    except Exception as err:  # a missing note never changes how the task ends
        log.warning("Could not record the failure of %s for its note: %s", task_instance.task_id, err)
