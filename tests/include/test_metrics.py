"""The regression metrics the train stage reports and the deploy gate scores a live champion with."""

from __future__ import annotations

import pytest

from airflow_ray_ml_stages.metrics import regression_metrics


def test_regression_metrics_match_definitions():
    assert regression_metrics([1, 4], [1, 2])["rmse"] == pytest.approx(2 ** 0.5)
    assert regression_metrics([1, 4], [1, 2])["mae"] == 1
    assert regression_metrics([1, 2], [1, 2.6])["acc_0_5"] == 0.5
