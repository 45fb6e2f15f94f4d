"""The metrics of each task, their directions, and the default one to choose models by.

Regression: RMSE, MAE and the share of predictions within 0.5 and 1.0 of the label (for graded
labels such as wine quality, as Cortez et al. (2009) report them). Classification: accuracy,
macro F1 (every class weighs the same, so a rare class counts) and log loss (the probabilities'
quality, what the search and the deploy gate use by default).
"""

from __future__ import annotations

import numpy as np

from airflow_ray_ml_stages.constants import DEFAULT_METRIC, TASK_METRICS  # noqa: F401  (the metrics of each task)

TOLERANCES = {"acc_0_5": 0.5, "acc_1_0": 1.0}

PROBABILITY_FLOOR = 1e-15
"""Log loss clips probabilities to [floor, 1 - floor], so one confident mistake costs a finite amount."""


def direction(metric: str) -> str:
    """``min`` or ``max`` for a metric of any task (``val_`` prefix allowed)."""
    name = metric.removeprefix("val_")
    for metrics in TASK_METRICS.values():
        if name in metrics:
            return metrics[name]
    known = sorted({name for metrics in TASK_METRICS.values() for name in metrics})
    raise ValueError(f"unknown metric {metric!r}; known: {known}")


def task_of_metric(metric: str) -> str:
    """The task a metric belongs to (``val_`` prefix allowed)."""
    name = metric.removeprefix("val_")
    return next(task for task, metrics in TASK_METRICS.items() if name in metrics)


def regression_metrics(labels, predictions) -> dict[str, float]:
    """RMSE, MAE and the share of predictions within 0.5 and 1.0 of the label."""
    labels = np.asarray(labels, dtype=np.float64)
    predictions = np.asarray(predictions, dtype=np.float64)
    if labels.shape != predictions.shape or labels.size == 0:
        raise ValueError(f"labels and predictions must be non-empty and alike, got {labels.shape} and {predictions.shape}")
    errors = np.abs(predictions - labels)
    metrics = {"rmse": float(np.sqrt(np.mean(errors**2))), "mae": float(np.mean(errors))}
    metrics.update({name: float(np.mean(errors <= tolerance)) for name, tolerance in TOLERANCES.items()})
    return metrics


def classification_metrics(labels, probabilities) -> dict[str, float]:
    """Log loss, accuracy and macro F1 of class probabilities against class indexes.

    :param labels: each row's class index (0 .. k-1).
    :param probabilities: rows x k, each row the predicted probability of every class.

    Macro F1 averages over the classes present in the labels or the predictions (a class neither
    in the data nor predicted has no F1), as scikit-learn's ``f1_score(average="macro")`` does.
    """
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 2 or probabilities.shape[0] != labels.size or labels.size == 0:
        raise ValueError(f"labels (rows) and probabilities (rows x classes) must be non-empty and alike, got "
                         f"{labels.shape} and {probabilities.shape}")
    classes = probabilities.shape[1]
    if labels.min() < 0 or labels.max() >= classes:
        raise ValueError(f"labels must be class indexes in [0, {classes}), got {labels.min()} .. {labels.max()}")
    clipped = np.clip(probabilities[np.arange(labels.size), labels], PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    predicted = probabilities.argmax(axis=1)
    true_positive = np.bincount(labels[predicted == labels], minlength=classes).astype(np.float64)
    actual = np.bincount(labels, minlength=classes).astype(np.float64)
    chosen = np.bincount(predicted, minlength=classes).astype(np.float64)
    present = (actual + chosen) > 0
    f1 = 2 * true_positive[present] / (actual[present] + chosen[present])
    return {"log_loss": float(-np.mean(np.log(clipped))), "accuracy": float(np.mean(predicted == labels)),
            "macro_f1": float(np.mean(f1))}


def task_metrics(task: str, labels, predictions) -> dict[str, float]:
    """The metrics of ``task`` (predictions: values for regression, class probabilities for classification)."""
    if task == "classification":
        return classification_metrics(labels, predictions)
    return regression_metrics(labels, predictions)


def validation_metrics(task: str, labels, predictions) -> dict[str, float]:
    """The task's metrics of validation predictions, named as Ray Tune sees them (``val_rmse``, ``val_log_loss``...)."""
    return {f"val_{name}": value for name, value in task_metrics(task, labels, predictions).items()}


def prior_probabilities(labels, classes: int) -> np.ndarray:
    """Each class's share of ``labels`` (class indexes): what the baseline classifier predicts for every row."""
    counts = np.bincount(np.asarray(labels).astype(np.int64).reshape(-1), minlength=classes).astype(np.float64)
    return counts / counts.sum()
