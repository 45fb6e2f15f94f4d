"""The metrics of each task, which the train stage reports and the deploy gate scores a live champion with."""

from __future__ import annotations

import pytest

import numpy as np

from airflow_ray_ml_stages.metrics import classification_metrics, direction, regression_metrics, task_of_metric


def test_regression_metrics_match_definitions():
    assert regression_metrics([1, 4], [1, 2])["rmse"] == pytest.approx(2 ** 0.5)
    assert regression_metrics([1, 4], [1, 2])["mae"] == 1
    assert regression_metrics([1, 2], [1, 2.6])["acc_0_5"] == 0.5


def test_classification_metrics_match_scikit_learns_definitions():
    # labels 0,1,2,1; predicted (argmax) 0,1,2,0
    probabilities = [[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]]
    metrics = classification_metrics([0, 1, 2, 1], probabilities)
    assert metrics["accuracy"] == 0.75
    # per class F1: 2/3 (1 of 2 predicted right), 2/3 (1 of 2 found), 1
    assert metrics["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    assert metrics["log_loss"] == pytest.approx(-(np.log(0.8) + np.log(0.7) + np.log(0.4) + np.log(0.4)) / 4)


def test_classification_log_loss_is_finite_for_a_confident_mistake_and_labels_must_be_indexes():
    assert np.isfinite(classification_metrics([1], [[1.0, 0.0]])["log_loss"])
    with pytest.raises(ValueError, match=r"class indexes in \[0, 2\)"):
        classification_metrics([2], [[0.5, 0.5]])
    with pytest.raises(ValueError, match="alike"):
        classification_metrics([0, 1], [[0.5, 0.5]])


def test_every_metric_has_one_direction_and_a_task():
    assert direction("val_log_loss") == "min" and direction("macro_f1") == "max" and direction("rmse") == "min"
    assert task_of_metric("val_accuracy") == "classification" and task_of_metric("mae") == "regression"
    with pytest.raises(ValueError, match="unknown metric"):
        direction("r2")
