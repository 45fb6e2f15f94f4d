"""Serve decisions as notes: a deploy's or rollback's decision becomes its task's note and the run's note.

A kept champion leaves its deploy task "skipped", and a person looking at the grid wants to know
why without opening the log. Tasks cannot write notes (the Task SDK has no call for it), so this
listener does it where the metadata database is at hand: when a DAG run finishes, the scheduler
(or ``dag.test()``) calls it, and it turns every ``decision`` XCom of the run (pushed by
``RayServeDeployOperator`` and ``RayServeRollbackOperator`` with the serving history's entry) into
the note of the task that pushed it, and, joined, into the run's note. A note a person already
wrote is never replaced.
"""

from __future__ import annotations

from typing import Any

from airflow.listeners import hookimpl

MAX_NOTE_CHARS = 1000  # Airflow's note column holds 1000


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
    return text[:MAX_NOTE_CHARS]


def note_decisions(dag_run: Any, session: Any) -> list[str]:
    """Write the run's decisions as notes (in ``session``); return the texts written."""
    from sqlalchemy import select

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel

    from airflow_ray_ml.plugins.ray_ml_runs import decode_xcom
    from airflow_ray_ml.ray_serve import DECISION_XCOM_KEY

    rows = session.execute(
        select(XComModel.task_id, XComModel.map_index, XComModel.value).where(
            XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id,
            XComModel.key == DECISION_XCOM_KEY)
    ).all()
    texts = []
    for task_id, map_index, raw in rows:
        decision = decode_xcom(raw)
        if not isinstance(decision, dict):
            continue
        text = decision_text(decision)
        texts.append(text)
        ti = session.scalar(select(TaskInstance).where(
            TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
            TaskInstance.task_id == task_id, TaskInstance.map_index == map_index))
        if ti is not None and not ti.note:
            ti.note = text
    if texts and not dag_run.note:
        dag_run.note = " · ".join(texts)[:MAX_NOTE_CHARS]
    return texts


def _on_finished(dag_run: Any) -> None:
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is not None:  # the caller's session: it commits the notes with the run's state
        note_decisions(dag_run, session)
        return
    from airflow.utils.session import create_session

    with create_session() as own:
        note_decisions(own.merge(dag_run), own)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _on_finished(dag_run)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _on_finished(dag_run)
