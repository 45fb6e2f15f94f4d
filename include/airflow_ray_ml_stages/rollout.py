"""What the serving application measures while a challenger runs beside the champion.

A deploy may put a challenger in *shadow* (a share of live requests is mirrored to it; clients get
the champion's answers) or in *canary* (a share of live requests is answered by it; a request it
fails is answered by the champion). The application's ingress deployment answers with the champion
and routes to the ``Challenger`` deployment (:mod:`airflow_ray_ml_stages.serve`); the challenger
keeps one :class:`RolloutStats`, which ``GET /rollout`` returns and the deploy compares.

Numbers kept: requests and rows each side handled, the challenger's failures, each side's answer
time (milliseconds its model took for the batch a request was in: the model's cost, not the queue
before it, which depends on how many replicas each side runs; in shadow, where a mirrored call's
requests are predicted together, the challenger's is one request's rows predicted alone, once a
call), both sides' predictions on
mirrored rows (agreement, distributions), and, for a label file that arrives later, each mirrored
row's key (:func:`row_key`) with both predictions, up to ``KEPT_ROWS`` rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROLLOUT_MODES = ("shadow", "canary")
KEPT_ROWS = 10_000  # mirrored rows whose predictions are kept for a label file
LATENCY_SAMPLES = 10_000  # each side's latest answer times kept for the percentiles
# Regression predictions agree where they differ by at most this share of the champion's spread
# (standard deviation of its predictions on the mirrored rows).
AGREEMENT_SPREAD = 0.1


def row_key(values: list[Any]) -> str:
    """A row's key from its input values in column order: numbers as floats, missing as null.

    The application keys the rows it mirrors and the deploy keys a label file's rows the same way,
    so ``7``, ``7.0`` and ``np.float32(7)`` are one value.
    """
    def norm(value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, (int, float, np.integer, np.floating)):
            number = float(value)
            return None if math.isnan(number) else round(number, 9)
        return str(value)

    text = json.dumps([norm(value) for value in values], separators=(",", ":"))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:20]


def row_keys(frame: Any, input_columns: list[str], boolean_columns: list[str]) -> list[str]:
    """Each row's :func:`row_key`, a boolean column's value read as the preprocessor reads it
    (``True``, ``"yes"`` and ``1`` are one value), so a label file's rows match the requests'."""
    from airflow_ray_ml_stages.preprocessor import boolean_number

    booleans = {position for position, column in enumerate(input_columns) if column in set(boolean_columns)}
    keys = []
    for values in frame[input_columns].itertuples(index=False, name=None):
        if booleans:
            values = [boolean_number(value) if position in booleans else value
                      for position, value in enumerate(values)]
        keys.append(row_key(list(values)))
    return keys


class ShareTaker:
    """Takes exactly ``share`` of the calls, spread evenly (every 10th for 0.1), no randomness."""

    def __init__(self, share: float) -> None:
        self.share = float(share)
        self.seen = 0

    def take(self) -> bool:
        self.seen += 1
        return math.floor(self.seen * self.share) > math.floor((self.seen - 1) * self.share)


def _percentiles(samples: Any) -> dict[str, float | None]:
    values = np.asarray(list(samples), dtype="float64")
    if not len(values):
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def _distribution(values: Any) -> dict[str, float | None]:
    data = np.asarray(values, dtype="float64")
    if not len(data):
        return {"mean": None, "std": None, "p10": None, "p50": None, "p90": None}
    p10, p50, p90 = np.percentile(data, [10, 50, 90])
    return {"mean": float(data.mean()), "std": float(data.std()), "p10": float(p10), "p50": float(p50),
            "p90": float(p90)}


@dataclass
class ChampionCounts:
    """What an ingress replica saw of the champion since it last reported: requests, failures, times."""

    requests: int = 0
    failures: int = 0
    answer_ms: list[float] = field(default_factory=list)

    def add(self, failed: bool, answer_ms: float | None) -> None:
        self.requests += 1
        self.failures += int(failed)
        if answer_ms is not None and len(self.answer_ms) < 256:
            self.answer_ms.append(answer_ms)

    def take(self) -> dict[str, Any]:
        """The counts so far, as sent with a call to the challenger; they start again from zero."""
        counts = {"requests": self.requests, "failures": self.failures, "answer_ms": self.answer_ms}
        self.requests, self.failures, self.answer_ms = 0, 0, []
        return counts


class RolloutStats:
    """The challenger's record of one rollout: what both sides answered and how fast."""

    def __init__(self, mode: str, share: float, challenger_version: str, classification: bool,
                 kept_rows: int = KEPT_ROWS) -> None:
        self.mode, self.share, self.challenger_version = mode, share, challenger_version
        self.classification = classification
        self.kept_rows = kept_rows
        self.champion = {"requests": 0, "failures": 0}
        self.challenger = {"requests": 0, "rows": 0, "failures": 0}
        self.champion_ms: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.challenger_ms: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self.compared_rows = 0
        self.agreeing_rows = 0.0  # classification: same class; regression: counted in summary()
        self.abs_difference = 0.0
        # per kept row: key, champion prediction, challenger prediction (regression: numbers;
        # classification: the class and the probabilities in ``classes`` order)
        self.rows: list[list[Any]] = []
        self.classes: dict[str, list[Any] | None] = {"champion": None, "challenger": None}
        self.last_failure: str | None = None

    def add_champion(self, counts: dict[str, Any]) -> None:
        self.champion["requests"] += int(counts.get("requests") or 0)
        self.champion["failures"] += int(counts.get("failures") or 0)
        self.champion_ms.extend(float(ms) for ms in counts.get("answer_ms") or [])

    def add_failure(self, rows: int, error: str, requests: int = 1) -> None:
        """The challenger failed ``requests`` requests of ``rows`` rows in all."""
        self.challenger["requests"] += requests
        self.challenger["rows"] += rows
        self.challenger["failures"] += requests
        self.last_failure = error[-500:]

    def add_answer(self, keys: list[str], answer: dict[str, Any], answer_ms: float,
                   champion: dict[str, Any] | None, requests: int = 1) -> None:
        """The challenger's ``answer`` (of ``requests`` requests); in shadow, ``keys`` are its rows'
        keys and ``champion`` the champion's answer to the same rows (in canary: ``[]`` and None)."""
        self.challenger["requests"] += requests
        self.challenger["rows"] += len(answer["predictions"])
        self.challenger_ms.append(answer_ms)
        if champion is None:
            return
        self.classes = {"champion": champion.get("classes"), "challenger": answer.get("classes")}
        mine, theirs = answer["predictions"], champion["predictions"]
        self.compared_rows += len(keys)
        if self.classification:
            self.agreeing_rows += sum(a == b for a, b in zip(mine, theirs))
        else:
            self.abs_difference += float(np.abs(np.asarray(mine, "float64") - np.asarray(theirs, "float64")).sum())
        room = self.kept_rows - len(self.rows)
        for index in range(min(room, len(keys))):
            if self.classification:
                self.rows.append([keys[index], theirs[index], champion["probabilities"][index], mine[index],
                                  answer["probabilities"][index]])
            else:
                self.rows.append([keys[index], theirs[index], mine[index]])

    def summary(self, with_rows: bool = False) -> dict[str, Any]:
        """The comparison so far, JSON-ready; ``with_rows`` adds the kept rows for a label file."""
        summary: dict[str, Any] = {
            "mode": self.mode, "share": self.share, "challenger_version": self.challenger_version,
            "champion": {**self.champion, "answer_ms": _percentiles(self.champion_ms)},
            "challenger": {**self.challenger, "answer_ms": _percentiles(self.challenger_ms)},
            "compared_rows": self.compared_rows, "last_failure": self.last_failure,
        }
        if self.compared_rows:
            if self.classification:
                summary["agreement"] = self.agreeing_rows / self.compared_rows
                summary["predictions"] = {
                    side: _class_shares([row[column] for row in self.rows])
                    for side, column in (("champion", 1), ("challenger", 3))}
            else:
                champion = np.asarray([row[1] for row in self.rows], "float64")
                challenger = np.asarray([row[2] for row in self.rows], "float64")
                tolerance = AGREEMENT_SPREAD * float(champion.std()) if len(champion) else 0.0
                summary["agreement"] = float(np.mean(np.abs(champion - challenger) <= tolerance)) if len(champion) else None
                summary["mean_abs_difference"] = self.abs_difference / self.compared_rows
                summary["predictions"] = {"champion": _distribution(champion), "challenger": _distribution(challenger)}
        if with_rows:
            summary["rows"] = self.rows
            summary["classes"] = self.classes
        return summary


def _class_shares(labels: list[Any]) -> dict[str, float]:
    """Each predicted class's share of the rows."""
    if not labels:
        return {}
    counts: dict[str, int] = {}
    for label in labels:
        counts[str(label)] = counts.get(str(label), 0) + 1
    return {label: count / len(labels) for label, count in sorted(counts.items())}
