"""Ray job states, and the decision a (re)started task takes about an earlier job of the same run."""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass
from typing import Mapping


class RayJobStatus(str, enum.Enum):
    """The states of a Ray job (the Jobs API's ``status`` field)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    def is_terminal(self) -> bool:
        return self in (RayJobStatus.STOPPED, RayJobStatus.SUCCEEDED, RayJobStatus.FAILED)


class Action(str, enum.Enum):
    SUBMIT = "submit"
    ATTACH = "attach"
    REUSE = "reuse"


@dataclass(frozen=True)
class Decision:
    action: Action
    submission_id: str


_SLUG = re.compile(r"[^a-z0-9]+")


def _slug(value: str, limit: int) -> str:
    return _SLUG.sub("-", value.lower()).strip("-")[:limit] or "x"


def base_submission_id(dag_id: str, run_id: str, task_id: str, map_index: int = -1, name: str | None = None) -> str:
    """A job id that is the same for every try of one task run and differs between task runs.

    Readable parts (dag, the run's ``name`` where given, such as the label column it trains on, and
    task) help in the Ray dashboard; the hash over the four ids makes it unique even when slugs
    collide or run ids are long.
    """
    named = f"{_slug(name, 24)}-" if name else ""
    mapped = "" if map_index < 0 else f"-m{map_index}"
    return f"{dag_prefix(dag_id)}{named}{_slug(task_id, 40)}{mapped}-{_task_run_digest(dag_id, run_id, task_id, map_index)}"


def dag_prefix(dag_id: str) -> str:
    """How the id of every job of ``dag_id``'s tasks starts."""
    return f"airflow-{_slug(dag_id, 40)}-"


def _task_run_digest(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    return hashlib.sha256(f"{dag_id}\x1f{run_id}\x1f{task_id}\x1f{map_index}".encode()).hexdigest()[:16]


def is_task_runs_id(base_id: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> bool:
    """Whether ``base_id`` is :func:`base_submission_id` of this task run, with whatever name it was given."""
    return (base_id.startswith(dag_prefix(dag_id))
            and base_id.endswith(f"-{_task_run_digest(dag_id, run_id, task_id, map_index)}"))


def attempt_id(base_id: str, attempt: int) -> str:
    """The id of the ``attempt``-th job of a task run: the base id first, then ``-r1``, ``-r2``..."""
    return base_id if attempt == 0 else f"{base_id}-r{attempt}"


def decide(base_id: str, existing: Mapping[str, RayJobStatus]) -> Decision:
    """Decide what a task try does given the jobs that earlier tries of the same run left.

    ``existing`` maps attempt ids to their status. The latest attempt decides:
    none → submit the base id; PENDING/RUNNING → attach to it; SUCCEEDED → reuse its manifest;
    FAILED/STOPPED → submit the next attempt id. So one task run never has two live jobs.
    """
    attempt = 0
    while attempt_id(base_id, attempt) in existing:
        attempt += 1
    if attempt == 0:
        return Decision(Action.SUBMIT, base_id)
    latest = attempt_id(base_id, attempt - 1)
    status = RayJobStatus(existing[latest])
    if status is RayJobStatus.SUCCEEDED:
        return Decision(Action.REUSE, latest)
    if not status.is_terminal():
        return Decision(Action.ATTACH, latest)
    return Decision(Action.SUBMIT, attempt_id(base_id, attempt))
