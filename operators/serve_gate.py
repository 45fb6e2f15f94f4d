"""The champion/challenger gate of a deploy, and the smoke test a promoted model must pass.

:func:`gate` compares the test metrics, and with :func:`paired_confidence` asks that the
challenger be better beyond the test rows' noise; :func:`champion_metric` finds the served champion's metric
on the challenger's test split (from its card when both were tested on the same data, else by
scoring it over its endpoint), or the schema changes that keep it from scoring those rows;
:func:`check_smoke_answer` judges the new version's first answer.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_ray_ml.errors import ServeDeployError, ServeModelRejectedError, ServeUnreachableError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_schema import ModelSchema, answer_problems, schema_changes
from airflow_ray_ml_stages.metrics import direction, task_metrics

if TYPE_CHECKING:
    import requests

# Rows of the challenger's test split sent to the champion in one request.
SCORING_BATCH_ROWS = 512

TIE = 1e-6
"""Metrics closer than this share of their size are a tie: one model's answers as kept in its file
and as its endpoint gives them differ in the last digits, which must not make it better."""

DEFAULT_MIN_CONFIDENCE = 0.95
"""The share of resamples in which a challenger must beat the champion to be promoted, by default."""

RESAMPLES = 500
"""Paired bootstrap resamples of the test rows that :func:`paired_confidence` draws."""

RESAMPLE_ROWS = 5_000
"""Rows per resample at most: a larger test split is resampled m out of n (m rows drawn from all n,
the spread scaled by sqrt(m / n)), so the gate takes a second or two however many rows it has."""


def gate(challenger: float, champion: float | None, metric: str, min_improvement: float, force: bool,
         confidence: float | None = None, min_confidence: float = 0.0) -> tuple[bool, str]:
    """Decide promotion: better than the champion by at least ``min_improvement`` (absolute) and, where
    ``min_confidence`` asks for it, in at least that share of the paired resamples (``confidence``,
    from :func:`paired_confidence`; None where it could not be measured: the plain comparison decides)."""
    if force:
        return True, "force=True"
    if champion is None:
        return True, "nothing is served yet"
    lower = direction(metric) == "min"
    gain = champion - challenger if lower else challenger - champion
    verdict = f"challenger {metric} {challenger:.4f} vs champion {champion:.4f} (needs {min_improvement:g} better"
    promote = gain >= min_improvement and gain > _tie(challenger, champion)
    if min_confidence > 0 and confidence is None:
        verdict += "; the noise was not measured (no answer per test row from the challenger): plain comparison"
    elif min_confidence > 0:
        verdict += (f", in {min_confidence:.0%} of {RESAMPLES} resamples of the test rows: "
                    f"better in {confidence:.1%}")
        promote = promote and confidence >= min_confidence
    return promote, verdict + ")"


def _tie(*metrics: float) -> float:
    return TIE * max(1e-12, *(abs(value) for value in metrics))


def _row_values(metric: str, labels: list[float], predictions: list[Any]) -> list[Any]:
    """What each row adds to ``metric``: a number whose mean (or, for RMSE, the root of whose mean) is
    the metric, or ``(label, predicted class)`` for macro F1."""
    from airflow_ray_ml_stages.metrics import PROBABILITY_FLOOR, TOLERANCES

    if metric in ("rmse", "mae", *TOLERANCES):
        errors = [abs(float(p) - y) for y, p in zip(labels, predictions)]
        if metric == "rmse":
            return [error * error for error in errors]
        if metric == "mae":
            return errors
        return [1.0 if error <= TOLERANCES[metric] else 0.0 for error in errors]
    chosen = [max(range(len(row)), key=row.__getitem__) for row in predictions]
    if metric == "log_loss":
        return [-math.log(min(max(row[int(y)], PROBABILITY_FLOOR), 1 - PROBABILITY_FLOOR))
                for y, row in zip(labels, predictions)]
    if metric == "accuracy":
        return [1.0 if c == int(y) else 0.0 for y, c in zip(labels, chosen)]
    return [(int(y), c) for y, c in zip(labels, chosen)]


def _aggregate(metric: str, values: Sequence[Any]) -> float:
    """The metric of rows' :func:`_row_values`."""
    if metric == "macro_f1":
        actual, chosen = Counter(y for y, _ in values), Counter(c for _, c in values)
        hits = Counter(y for y, c in values if y == c)
        classes = set(actual) | set(chosen)
        return sum(2 * hits[k] / (actual[k] + chosen[k]) for k in classes) / len(classes)
    mean = sum(values) / len(values)
    return math.sqrt(mean) if metric == "rmse" else mean


def paired_confidence(metric: str, labels: list[float], challenger: list[Any], champion: list[Any],
                      min_improvement: float, seed: int = 0) -> float:
    """The share of paired bootstrap resamples of the test rows in which the challenger's ``metric`` is
    better than the champion's by more than ``min_improvement``.

    Both models answered the same rows (``challenger[i]`` and ``champion[i]`` are their answers to
    the row labelled ``labels[i]``: values, or class probabilities), so each resample draws rows with
    replacement and scores both on the same draw: what the two have in common (hard rows, easy
    rows) cancels, and what is left is how sure the difference is. Seeded, so a decision repeats.
    """
    rows = len(labels)
    if not rows or len(challenger) != rows or len(champion) != rows:
        raise ValueError(f"paired answers needed: {rows} labels, {len(challenger)} and {len(champion)} answers")
    mine, theirs = _row_values(metric, labels, challenger), _row_values(metric, labels, champion)
    sign = 1.0 if direction(metric) == "min" else -1.0
    theirs_whole = _aggregate(metric, theirs)
    gain = sign * (theirs_whole - _aggregate(metric, mine))
    margin = min_improvement + _tie(theirs_whole)  # beyond the last digits
    draw = min(rows, RESAMPLE_ROWS)
    scale = math.sqrt(draw / rows)
    generator, indexes = random.Random(seed), range(rows)
    better = 0
    for _ in range(RESAMPLES):
        picked = generator.choices(indexes, k=draw)
        picked = itemgetter(*picked) if draw > 1 else lambda values, row=picked[0]: [values[row]]
        resampled = sign * (_aggregate(metric, picked(theirs)) - _aggregate(metric, picked(mine)))
        better += gain + (resampled - gain) * scale > margin
    return better / RESAMPLES


def answer_error(response: requests.Response) -> ServeDeployError:
    """A ``/predict`` answer other than 200 as the error to raise: its status and the problems it names."""
    # 503/504: no replica free yet, which may pass; any other answer is the model's
    error = ServeDeployError if response.status_code in (503, 504) else ServeModelRejectedError
    problems = answer_problems(response)
    return error(f"{response.request.method} {response.url} answered HTTP {response.status_code}"
                 + (f": {problems}" if problems else ""))


class Champion(NamedTuple):
    """What :func:`champion_metric` found of the served model.

    :param metric: its metric on the challenger's test rows; None when nothing is served or it cannot score them.
    :param version: its model version; None when nothing answers.
    :param changes: the schema changes that keep it from scoring those rows.
    :param answers: its answer to each test row (values, or class probabilities in the challenger's
        class order), where they were asked for and scored; else None.
    """

    metric: float | None
    version: str | None
    changes: list[str]
    answers: list[Any] | None = None


def champion_metric(hook: RayHook, route_prefix: str, api_key: str | None, challenger: dict[str, Any], metric: str,
                    rows: list[dict[str, Any]], labels: list[float], schema: ModelSchema,
                    per_row: bool = False) -> Champion:
    """The served model's test metric on the challenger's test split, its version, and the schema
    changes that keep it from scoring those rows (then no metric); ``Champion(None, None, [])`` when
    nothing answers at ``route_prefix``.

    The champion's ``/metadata`` (card and input schema) is compared with ``schema`` (the
    challenger's rows and labels) before any row is sent; a 422 that the comparison did not
    foresee counts as a schema change too, named by the fields it lists. Its card's metric stands
    for rows of the same data, unless ``per_row`` asks for its answer to each row (the gate's noise
    measure): then the rows are scored over its endpoint.
    """
    try:
        health = hook.get_endpoint_health(route_prefix, api_key=api_key)
    except ServeUnreachableError:
        return Champion(None, None, [])
    if health.status_code != 200:
        return Champion(None, None, [])
    metadata = hook.get_endpoint_metadata(route_prefix, api_key=api_key)
    version, task = metadata.get("model_version"), metadata.get("task") or "regression"
    changes = schema_changes(ModelSchema.from_metadata(metadata), schema)
    if changes:
        return Champion(None, version, changes)
    classes = challenger.get("classes")
    card_metric = ((metadata.get("metrics") or {}).get("test") or {}).get(metric)
    if not per_row and metadata.get("data_fingerprint") == challenger.get("data_fingerprint") and card_metric is not None:
        return Champion(float(card_metric), version, [])
    # Evaluated on other data, or each row's answer wanted: score the live champion on this test split, over HTTP.
    answers = []
    for start in range(0, len(rows), SCORING_BATCH_ROWS):
        response = hook.post_endpoint_predict(route_prefix, rows[start:start + SCORING_BATCH_ROWS], api_key=api_key)
        if response.status_code == 422:
            return Champion(None, version, [f"what its answer to the challenger's rows names: {answer_problems(response)}"])
        if response.status_code != 200:
            raise answer_error(response)
        answers.append(response.json())
    if classes is None:
        predictions = [value for answer in answers for value in answer["predictions"]]
    else:  # the champion's probabilities, in the order of the challenger's classes (the same set)
        columns = [answers[0]["classes"].index(value) for value in classes]
        predictions = [[row[column] for column in columns] for answer in answers for row in answer["probabilities"]]
    return Champion(task_metrics(task, labels, predictions)[metric], version, [], predictions)


def check_smoke_answer(answer: dict[str, Any], version: str, count: int, classes: list[Any] | None) -> None:
    """Raise :class:`ServeModelRejectedError` unless ``answer`` (to ``count`` rows) is from ``version``
    and usable: a finite number per row, or one of ``classes`` per row with probabilities that sum to 1."""
    predictions = answer.get("predictions") or []
    if answer.get("model_version") != version:
        raise ServeModelRejectedError(f"smoke test answered by version {answer.get('model_version')!r}, "
                                      f"not {version!r}")
    if classes is None:
        usable = len(predictions) == count and all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) for p in predictions)
    else:
        probabilities = answer.get("probabilities") or []
        usable = (len(predictions) == count and all(p in classes for p in predictions)
                  and len(probabilities) == count
                  and all(len(row) == len(classes) and abs(sum(row) - 1) < 1e-3 for row in probabilities))
    if not usable:
        wanted = ("a finite number each" if classes is None
                  else f"one of {classes!r:.200} each, with probabilities that sum to 1")
        got = len(predictions) if isinstance(predictions, list) else 0
        raise ServeModelRejectedError(f"smoke test got unusable predictions: {got} answers for {count} rows, "
                                      f"wanted {wanted}")
