"""The Tune plot's title and legend: they describe the trials that ran, not the search space."""

from __future__ import annotations

from airflow_ray_ml_stages.tune import plot_leaderboard, plot_legend, plot_title
from tests.conftest import requires_ml_extra


def _row(trial_id: str, family: str, status: str) -> dict:
    return {"trial_id": trial_id, "family": family, "status": status, "end_s": 2.0,
            "metrics": {"val_rmse": 0.7}}


def test_plot_title_counts_one_trial_in_the_singular_and_more_in_the_plural():
    one = {"total": 1, "completed": 1, "early_stopped": 0, "failed": 0}
    assert plot_title(one, "random", "asha").startswith("1 trial (1 completed,")
    assert plot_title({**one, "total": 4}, "optuna", "fifo").startswith("4 trials (")


@requires_ml_extra
def test_plot_legend_names_only_the_families_and_end_states_of_the_trials_drawn():
    rows = [_row("a", "xgboost", "COMPLETED"), _row("b", "lightning", "FAILED")]
    # the lightning trial failed before it reported: no line of it, so no legend entry either
    assert plot_legend(rows, {"a": [(1.0, 0.8), (2.0, 0.7)]}) == (["xgboost"], ["COMPLETED"])
    both = plot_legend(rows + [_row("c", "lightning", "EARLY_STOPPED")], {"a": [(1.0, 0.8)], "c": [(1.5, 0.9)]})
    assert both == (["lightning", "xgboost"], ["COMPLETED", "EARLY_STOPPED"])
    png = plot_leaderboard(rows, {"a": [(1.0, 0.8), (2.0, 0.7)]}, "val_rmse", "min", "1 trial")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
