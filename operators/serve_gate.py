"""The champion/challenger gate of a deploy, and the smoke test a promoted model must pass.

:func:`gate` compares the test metrics; :func:`champion_metric` finds the served champion's metric
on the challenger's test split (from its card when both were tested on the same data, else by
scoring it over its endpoint), or the schema changes that keep it from scoring those rows;
:func:`check_smoke_answer` judges the new version's first answer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from airflow_ray_ml.errors import ServeDeployError, ServeModelRejectedError, ServeUnreachableError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_schema import ModelSchema, answer_problems, schema_changes
from airflow_ray_ml_stages.metrics import direction, task_metrics

if TYPE_CHECKING:
    import requests

# Rows of the challenger's test split sent to the champion in one request.
SCORING_BATCH_ROWS = 512


def gate(challenger: float, champion: float | None, metric: str, min_improvement: float, force: bool) -> tuple[bool, str]:
    """Decide promotion: better than the champion by at least ``min_improvement`` (absolute)."""
    if force:
        return True, "force=True"
    if champion is None:
        return True, "nothing is served yet"
    lower = direction(metric) == "min"
    gain = champion - challenger if lower else challenger - champion
    verdict = f"challenger {metric} {challenger:.4f} vs champion {champion:.4f} (needs {min_improvement:g} better)"
    return gain >= min_improvement and gain > 0, verdict


def answer_error(response: requests.Response) -> ServeDeployError:
    """A ``/predict`` answer other than 200 as the error to raise: its status and the problems it names."""
    # 503/504: no replica free yet, which may pass; any other answer is the model's
    error = ServeDeployError if response.status_code in (503, 504) else ServeModelRejectedError
    problems = answer_problems(response)
    return error(f"{response.request.method} {response.url} answered HTTP {response.status_code}"
                 + (f": {problems}" if problems else ""))


def champion_metric(hook: RayHook, route_prefix: str, api_key: str | None, challenger: dict[str, Any], metric: str,
                    rows: list[dict[str, Any]], labels: list[float],
                    schema: ModelSchema) -> tuple[float | None, str | None, list[str]]:
    """The served model's test metric on the challenger's test split, its version, and the schema
    changes that keep it from scoring those rows (then no metric); ``(None, None, [])`` when nothing
    answers at ``route_prefix``.

    The champion's ``/metadata`` (card and input schema) is compared with ``schema`` (the
    challenger's rows and labels) before any row is sent; a 422 that the comparison did not
    foresee counts as a schema change too, named by the fields it lists.
    """
    try:
        health = hook.get_endpoint_health(route_prefix, api_key=api_key)
    except ServeUnreachableError:
        return None, None, []
    if health.status_code != 200:
        return None, None, []
    metadata = hook.get_endpoint_metadata(route_prefix, api_key=api_key)
    version, task = metadata.get("model_version"), metadata.get("task") or "regression"
    changes = schema_changes(ModelSchema.from_metadata(metadata), schema)
    if changes:
        return None, version, changes
    classes = challenger.get("classes")
    card_metric = ((metadata.get("metrics") or {}).get("test") or {}).get(metric)
    if metadata.get("data_fingerprint") == challenger.get("data_fingerprint") and card_metric is not None:
        return float(card_metric), version, []
    # Evaluated on other data: score the live champion on this test split, over HTTP.
    answers = []
    for start in range(0, len(rows), SCORING_BATCH_ROWS):
        response = hook.post_endpoint_predict(route_prefix, rows[start:start + SCORING_BATCH_ROWS], api_key=api_key)
        if response.status_code == 422:
            return None, version, [f"what its answer to the challenger's rows names: {answer_problems(response)}"]
        if response.status_code != 200:
            raise answer_error(response)
        answers.append(response.json())
    if classes is None:
        predictions = [value for answer in answers for value in answer["predictions"]]
        return task_metrics(task, labels, predictions)[metric], version, []
    # The champion's probabilities, in the order of the challenger's classes (the same set).
    columns = [answers[0]["classes"].index(value) for value in classes]
    probabilities = [[row[column] for column in columns] for answer in answers for row in answer["probabilities"]]
    return task_metrics(task, labels, probabilities)[metric], version, []


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
