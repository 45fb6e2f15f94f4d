"""Regression metrics for the quality grade, as Cortez et al. (2009) report them."""

from __future__ import annotations

import numpy as np

TOLERANCES = {"acc_0_5": 0.5, "acc_1_0": 1.0}


def regression_metrics(labels, predictions) -> dict[str, float]:
    """RMSE, MAE and the share of predictions within 0.5 and 1.0 grades of the label."""
    labels = np.asarray(labels, dtype=np.float64)
    predictions = np.asarray(predictions, dtype=np.float64)
    if labels.shape != predictions.shape or labels.size == 0:
        raise ValueError(f"labels and predictions must be non-empty and alike, got {labels.shape} and {predictions.shape}")
    errors = np.abs(predictions - labels)
    metrics = {"rmse": float(np.sqrt(np.mean(errors**2))), "mae": float(np.mean(errors))}
    metrics.update({name: float(np.mean(errors <= tolerance)) for name, tolerance in TOLERANCES.items()})
    return metrics
