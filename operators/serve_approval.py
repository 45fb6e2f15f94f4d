"""A person's approval between the gate and the promotion, through Airflow's Human-in-the-loop.

``RayServeDeployOperator(approval=True)`` asks, once the gate (and a shadow or canary) would
promote, with the options ``Approve`` and ``Reject`` and a ``reason`` field, in Airflow's "Required
actions" (the HITL form, as ``ApprovalOperator`` asks): :func:`ask` writes the request with the
evidence as its body (:func:`evidence_body`) and parks the task until someone answers. Airflow 3.3
and newer park it as ``awaiting_input``; older ones defer to the standard provider's ``HITLTrigger``.
Either way the task resumes in the method named, with the answer as ``event`` (:func:`answer_of`).
A timeout answers ``Reject`` by itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow_ray_ml_stages.metrics import direction

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

APPROVE, REJECT = "Approve", "Reject"
OPTIONS = [APPROVE, REJECT]
REASON = "reason"  # the form's field for why


def _params() -> dict[str, Any]:
    """The form's ``reason`` field, serialised as the task SDK of this Airflow stores HITL params."""
    from airflow.sdk import Param

    param = Param("", type=["string", "null"], title="Reason",
                  description="Why (kept in the serving history; required to make sense of a rejection)")
    from airflow import __version__
    from packaging.version import Version

    if Version(Version(__version__).base_version) >= Version("3.1.3"):  # the whole Param, as ApprovalOperator
        return {REASON: param.serialize()}
    return {REASON: param.value}  # Airflow 3.1.1 and 3.1.2 store the value only


def ask(operator: BaseOperator, context: Context, *, subject: str, body: str, timeout: timedelta | None,
        approvers: list[str] | None, method_name: str) -> NoReturn:
    """Write the approval request of this task instance and park the task until it is answered."""
    from airflow.sdk.execution_time.hitl import upsert_hitl_detail

    ti_id = context["task_instance"].id
    defaults = [REJECT] if timeout else None
    assigned = [{"id": user, "name": user} for user in approvers] if approvers else None
    upsert_hitl_detail(ti_id=ti_id, options=OPTIONS, subject=subject, body=body, defaults=defaults,
                       multiple=False, params=_params(), assigned_users=assigned)
    try:
        from airflow.sdk.exceptions import TaskAwaitingInput
    except ImportError:  # before Airflow 3.3: the standard provider's trigger waits for the answer
        from airflow.providers.standard.triggers.hitl import HITLTrigger
        from airflow.sdk.timezone import utcnow

        operator.defer(trigger=HITLTrigger(ti_id=ti_id, options=OPTIONS, defaults=defaults, params=_params(),
                                           multiple=False, timeout_datetime=utcnow() + timeout if timeout else None),
                       method_name=method_name)
    raise TaskAwaitingInput(method_name=method_name, timeout=timeout)


def answer_of(event: dict[str, Any]) -> dict[str, Any]:
    """The answer in a resume ``event``: ``approved``, ``by`` (the user's name; None for a timeout), ``at`` and ``reason``."""
    if "error" in event:  # a trigger's error (no answer and no default)
        return {"approved": False, "by": None, "at": None,
                "reason": f"no answer: {event.get('error_type') or event.get('error')}"}
    chosen = list(event.get("chosen_options") or [])
    user = event.get("responded_by_user") or {}
    at = event.get("responded_at")
    reason = str((event.get("params_input") or {}).get(REASON) or "").strip()
    by = user.get("name") or user.get("id") if isinstance(user, dict) else None
    if not by and event.get("timedout", not user):
        reason = reason or "no one answered in time"
    return {"approved": chosen == [APPROVE], "by": by, "at": at.isoformat() if hasattr(at, "isoformat") else at,
            "reason": reason}


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"


def _failures(side: dict[str, Any]) -> str:
    """A side's failed requests as a share of the requests it answered, with both counts in words."""
    requests, failures = side.get("requests", 0) or 0, side.get("failures", 0) or 0
    if not requests:
        return "— (no requests)"
    return f"{failures / requests:.1%} ({failures} of {requests} it answered)"


def _sentence(text: str) -> str:
    text = str(text).strip()
    return text if not text or text[-1] in ".!?" else text + "."


def evidence_body(summary: dict[str, Any], rollout: dict[str, Any] | None, drift: list[str]) -> str:
    """The approval form's body, in Markdown: the test metrics, the live comparison, the drift that
    started the run. Each statement is a paragraph of its own; the table puts like beside like (a
    share of each side's own requests, not two counts of different totals) and says which way is
    better."""
    metric = summary.get("metric")
    better = "lower is better" if metric and direction(metric) == "min" else "higher is better"
    lines = [f"**Promote {summary.get('challenger_version')}** in place of "
             f"{summary.get('champion_version') or 'nothing (no model is served)'}?", "",
             _sentence(f"Gate: {summary.get('reason')}"), "",
             "| | challenger | champion | good |", "|---|---|---|---|",
             f"| test {metric} | {_number(summary.get('challenger'))} | {_number(summary.get('champion'))} | {better} |"]
    if rollout:
        sides = (rollout.get("challenger") or {}, rollout.get("champion") or {})
        p50 = [(side.get("answer_ms") or {}).get("p50") for side in sides]
        lines += [f"| median answer time (ms) | {_number(p50[0])} | {_number(p50[1])} | lower is better |",
                  f"| failed requests | {_failures(sides[0])} | {_failures(sides[1])} | 0 % |"]
        live = rollout.get("live") or {}
        if live.get("rows"):
            lines.append(f"| live {live.get('metric')} on {live['rows']} labelled rows | "
                         f"{_number(live.get('challenger'))} | {_number(live.get('champion'))} | {better} |")
        lines += ["", _sentence(f"{rollout.get('mode', '').capitalize()} trial on {rollout.get('share', 0):.0%} of "
                                f"the requests: {rollout.get('verdict', '')}")]
        if rollout.get("agreement") is not None:
            lines += ["", f"Agreement with the champion: on {rollout['agreement']:.1%} of the "
                          f"{rollout.get('compared_rows', 0)} rows both answered, the challenger gave the champion's "
                          "answer (the same class, or a value within a tenth of the champion's standard deviation). Near 100 %: it "
                          "changes few answers; lower: check that the changes are improvements (the live metric)."]
    lines += ["", "Drift that started this run: " + ("; ".join(drift) if drift else "none")]
    return "\n".join(lines)
