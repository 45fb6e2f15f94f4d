"""A challenger tried on live traffic before it is promoted: shadow or canary, and the verdict.

``RayServeDeployOperator(rollout="shadow")`` puts the challenger beside the champion in the same
Serve application (:mod:`airflow_ray_ml_stages.serve`: the ingress answers with the champion and
routes a share of requests to the ``Challenger`` deployment), reads what both answered from the
application's ``/rollout`` until ``rows`` rows were compared or ``timeout_s`` passed, and decides:

* **roll back** when the challenger failed more requests than the champion by over ``max_error_rate``
  (a canary is rolled back as soon as this holds over ``MIN_REQUESTS`` requests);
* **keep** the champion when the challenger's median answer time is over ``max_latency_ratio``
  times the champion's, or when a label file (rows with the label, arriving after the requests) scores
  the challenger no better than the champion on the rows both answered, by the deploy's gate;
* **promote** otherwise: the test metrics already passed the gate.

:func:`verdict` is pure; :func:`live_metrics` joins the kept rows with a label file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_ray_ml.errors import InvalidSpecError
from airflow_ray_ml.serve_apps import CHALLENGER_DEPLOYMENT

ROLLOUTS = ("direct", "shadow", "canary")
DEFAULT_SHARE = {"shadow": 1.0, "canary": 0.1}
POLL_S = 1.0  # how often the deploy reads /rollout
MIN_REQUESTS = 20  # challenger requests before its error rate may roll a canary back early
MIN_LATENCY_SAMPLES = 10  # answers each side needs before answer times are compared
MIN_LABELLED_ROWS = 20  # labelled rows before a label file decides
# The challenger runs one replica, which keeps the one record of the rollout. Without a rollout it
# has neither model nor replica: IDLE_AUTOSCALING, its code's default (kept equal to
# airflow_ray_ml_stages.serve.IDLE_AUTOSCALING by a test). The application's config lists the
# Challenger in both states: Serve's code version of an application hashes one entry per
# deployment that has an autoscaling config, so an entry that came and went with each trial would
# rebuild the application and restart the champion's replicas at its start and its end. Idle, it
# averages its load over 2 s (Serve's default is 30 s), so an ended trial's replica stops within
# seconds of its last request rather than holding its CPU for half a minute.
ACTIVE_AUTOSCALING = {"min_replicas": 1, "max_replicas": 1, "initial_replicas": 1}
IDLE_AUTOSCALING = {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0, "downscale_delay_s": 1,
                    "downscale_to_zero_delay_s": 1, "look_back_period_s": 2, "metrics_interval_s": 1}


@dataclass(frozen=True)
class Rollout:
    """How a deploy tries its challenger on live traffic before promoting it (``mode`` ``direct``: not at all)."""

    mode: str = "direct"
    share: float | None = None
    rows: int = 1000
    timeout_s: float = 600.0
    labels: str | None = None
    max_error_rate: float = 0.01
    max_latency_ratio: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in ROLLOUTS:
            raise InvalidSpecError(f"rollout must be one of {list(ROLLOUTS)}, got {self.mode!r}")
        if self.share is not None and not (isinstance(self.share, (int, float)) and 0 < self.share <= 1):
            raise InvalidSpecError(f"rollout_share must be a share of requests in (0, 1] (0.1: one in ten), "
                                   f"got {self.share!r}")
        if not isinstance(self.rows, int) or isinstance(self.rows, bool) or self.rows < 1:
            raise InvalidSpecError(f"rollout_rows must be a whole number of rows >= 1, got {self.rows!r}")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s < math.inf):
            raise InvalidSpecError(f"rollout_timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if not (isinstance(self.max_error_rate, (int, float)) and 0 <= self.max_error_rate <= 1):
            raise InvalidSpecError(f"max_error_rate must be a share in [0, 1], got {self.max_error_rate!r}")
        if not (isinstance(self.max_latency_ratio, (int, float)) and self.max_latency_ratio >= 1):
            raise InvalidSpecError(f"max_latency_ratio must be a number >= 1 (2: twice the champion's median "
                                   f"answer time), got {self.max_latency_ratio!r}")

    @property
    def live(self) -> bool:
        return self.mode != "direct"

    @property
    def traffic_share(self) -> float:
        return float(self.share if self.share is not None else DEFAULT_SHARE[self.mode])

    def user_config(self, challenger_version: str) -> dict[str, Any]:
        """The ``rollout`` entry of both deployments' ``user_config``."""
        return {"mode": self.mode, "share": self.traffic_share, "challenger_version": challenger_version}

    def done(self, stats: dict[str, Any] | None) -> bool:
        """Whether enough was seen: ``rows`` rows compared (shadow) or answered (canary), or a canary
        failing beyond the allowed rate over ``MIN_REQUESTS`` requests."""
        if not stats:
            return False
        challenger = stats.get("challenger") or {}
        seen = stats.get("compared_rows", 0) if self.mode == "shadow" else challenger.get("rows", 0)
        if seen >= self.rows:
            return True
        return (self.mode == "canary" and challenger.get("requests", 0) >= MIN_REQUESTS
                and _excess_failures(stats) > self.max_error_rate)


def challenger_deployment(actor_options: dict[str, Any], challenger: dict[str, Any] | None = None,
                          rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``Challenger`` deployment's entry in the application's config: ``challenger`` tried as
    ``rollout`` says, or, without them, idle (no model, no replica)."""
    entry = {"name": CHALLENGER_DEPLOYMENT, "autoscaling_config": IDLE_AUTOSCALING, "user_config": {},
             "ray_actor_options": actor_options, "max_ongoing_requests": 256}
    if challenger is None or rollout is None:
        return entry
    return {**entry, "autoscaling_config": ACTIVE_AUTOSCALING,
            "user_config": {"challenger": {"model_dir": challenger["model_dir"],
                                           "model_version": challenger["model_version"]}, "rollout": rollout}}


def _rate(side: dict[str, Any]) -> float:
    requests = side.get("requests") or 0
    return (side.get("failures") or 0) / requests if requests else 0.0


def _excess_failures(stats: dict[str, Any]) -> float:
    """How much more often the challenger failed than the champion (a share of requests)."""
    return _rate(stats.get("challenger") or {}) - _rate(stats.get("champion") or {})


def verdict(stats: dict[str, Any] | None, rollout: Rollout, live: dict[str, Any] | None,
            gate_live: Any) -> tuple[str, str]:
    """``promote``, ``keep`` or ``roll_back``, and why, from what the rollout saw.

    :param stats: the application's ``/rollout`` answer (None: the challenger never reported).
    :param live: :func:`live_metrics`' result, or None without a label file.
    :param gate_live: the deploy's gate, ``(challenger, champion) -> (promote, why)``.
    """
    if not stats:
        return "roll_back", "the challenger never reported: it did not start or cannot be reached"
    challenger, champion = stats.get("challenger") or {}, stats.get("champion") or {}
    if not challenger.get("requests"):
        return "promote", "no live request reached the challenger; the test metrics decide"
    excess = _excess_failures(stats)
    if excess > rollout.max_error_rate:
        last = f" (last: {stats['last_failure']})" if stats.get("last_failure") else ""
        return "roll_back", (f"the challenger failed {challenger.get('failures', 0)} of {challenger['requests']} "
                             f"requests ({_rate(challenger):.1%}), the champion {_rate(champion):.1%}: over "
                             f"{rollout.max_error_rate:.1%} more{last}")
    mine = (challenger.get("answer_ms") or {}).get("p50")
    theirs = (champion.get("answer_ms") or {}).get("p50")
    enough = min(challenger.get("requests", 0), champion.get("requests", 0)) >= MIN_LATENCY_SAMPLES
    if enough and mine is not None and theirs and mine / theirs > rollout.max_latency_ratio:
        return "keep", (f"the challenger's median answer time {mine:.1f} ms is {mine / theirs:.1f}x the "
                        f"champion's {theirs:.1f} ms (at most {rollout.max_latency_ratio:g}x)")
    if live is not None and live["rows"] >= MIN_LABELLED_ROWS:
        promote, why = gate_live(live["challenger"], live["champion"])
        return ("promote" if promote else "keep"), f"on {live['rows']} labelled live rows: {why}"
    seen = f"{stats.get('compared_rows', 0)} rows compared" if rollout.mode == "shadow" else \
        f"{challenger.get('rows', 0)} rows answered"
    labelled = f"; {live['rows']} labelled rows are too few to decide" if live is not None else ""
    return "promote", f"{seen}, no failures beyond the champion's{labelled}"


def live_metrics(stats: dict[str, Any], labels: Any, label_column: str, input_columns: list[str],
                 boolean_columns: list[str], classes: list[Any] | None, metric: str) -> dict[str, Any]:
    """Both models' ``metric`` on the mirrored rows whose label the ``labels`` frame gives.

    A label file's row is matched by its input values (:func:`airflow_ray_ml_stages.rollout.row_keys`:
    a boolean column's ``yes`` is the ``true`` a client sent); ``classes``: the challenger's classes
    (the champion's probabilities are put in their order).
    """
    from airflow_ray_ml_stages.metrics import task_metrics
    from airflow_ray_ml_stages.rollout import row_keys

    missing = [column for column in [*input_columns, label_column] if column not in labels.columns]
    if missing:
        raise InvalidSpecError(f"the rollout's label file lacks the columns {missing}: it needs every input "
                               f"column {input_columns} and the label {label_column!r}")
    known = dict(zip(row_keys(labels, input_columns, boolean_columns), labels[label_column]))
    matched = [(known[row[0]], row) for row in stats.get("rows") or [] if row[0] in known]
    result: dict[str, Any] = {"metric": metric, "rows": len(matched), "champion": None, "challenger": None}
    if not matched:
        return result
    if classes is None:
        truth = [float(label) for label, _ in matched]
        result["champion"] = task_metrics("regression", truth, [row[1] for _, row in matched])[metric]
        result["challenger"] = task_metrics("regression", truth, [row[2] for _, row in matched])[metric]
        return result
    index = {str(value): position for position, value in enumerate(classes)}
    matched = [(label, row) for label, row in matched if str(label) in index]
    result["rows"] = len(matched)
    if not matched:
        return result
    champion_classes = [str(value) for value in (stats.get("classes") or {}).get("champion") or classes]
    order = [champion_classes.index(str(value)) for value in classes]
    truth = [index[str(label)] for label, _ in matched]
    result["champion"] = task_metrics("classification", truth,
                                      [[row[2][column] for column in order] for _, row in matched])[metric]
    result["challenger"] = task_metrics("classification", truth, [row[4] for _, row in matched])[metric]
    return result


def seen_stats(stats: dict[str, Any] | None) -> dict[str, Any]:
    """An endpoint's ``/rollout`` answer without the rows it kept (and their classes): what is recorded of it."""
    return {key: value for key, value in (stats or {}).items() if key not in ("rows", "classes")}


def evidence(rollout: Rollout, stats: dict[str, Any] | None, live: dict[str, Any] | None,
             why: str, started_at: str, ended_at: str) -> dict[str, Any]:
    """What a rollout saw, as the serving history and the page keep it (without the kept rows), and
    when it ran: from the config that started it to its verdict (UTC, ISO 8601 to the millisecond;
    a promotion's config is put after ``ended_at``)."""
    return {**seen_stats(stats), "mode": rollout.mode, "share": rollout.traffic_share, "live": live, "verdict": why,
            "started_at": started_at, "ended_at": ended_at}


def now_iso() -> str:
    """This moment in UTC, as a rollout's record keeps it."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def without_rollout(app_config: dict[str, Any]) -> dict[str, Any]:
    """An application's config with its challenger taken out: the champion serves alone, the
    challenger idles (its entry stays, see ``IDLE_AUTOSCALING``)."""
    deployments = []
    for deployment in app_config.get("deployments") or []:
        if deployment.get("name") == CHALLENGER_DEPLOYMENT:
            deployments.append({**deployment, "autoscaling_config": IDLE_AUTOSCALING, "user_config": {}})
            continue
        user_config = {key: value for key, value in (deployment.get("user_config") or {}).items() if key != "rollout"}
        deployments.append({**deployment, "user_config": user_config})
    return {**app_config, "deployments": deployments}
