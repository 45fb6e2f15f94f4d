"""The deploy gate's noise measure: a paired bootstrap over the test rows both models answered.

The answers are built here with a known relation to the labels (seeded), so each test knows whether
the challenger is better by skill or only by the rows' noise.
"""

from __future__ import annotations

import random

import pytest

from airflow_ray_ml.serve_gate import RESAMPLE_ROWS, gate, paired_confidence
from airflow_ray_ml_stages.metrics import task_metrics

ROWS = 1000


def _regression(rows: int = ROWS, seed: int = 7) -> tuple[list[float], list[float], list[float], list[float]]:
    """Labels; a champion's answers; a challenger as good but for its own noise, that happens to score a
    hair better on these rows; and a challenger clearly better (half the champion's error)."""
    generator = random.Random(seed)
    labels = [generator.uniform(3, 9) for _ in range(rows)]
    champion = [label + generator.gauss(0, 0.7) for label in labels]
    for attempt in range(1, 100):  # the first of its kind that is ahead: by chance, not by skill
        twin_noise = random.Random(seed * 1000 + attempt)
        twin = [label + twin_noise.gauss(0, 0.7) for label in labels]
        if _rmse(labels, twin) < _rmse(labels, champion):
            break
    better = [label + (answer - label) * 0.5 for label, answer in zip(labels, champion)]
    return labels, champion, twin, better


def _rmse(labels: list[float], answers: list[float]) -> float:
    return task_metrics("regression", labels, answers)["rmse"]


def test_a_challenger_ahead_only_by_the_rows_noise_is_kept_a_clearly_better_one_promoted():
    labels, champion, twin, better = _regression()
    champion_rmse = _rmse(labels, champion)
    assert _rmse(labels, twin) < champion_rmse  # the plain rule would promote it

    noise = paired_confidence("rmse", labels, twin, champion, 0.0)
    assert noise < 0.95
    promote, why = gate(_rmse(labels, twin), champion_rmse, "rmse", 0.0, False, noise, 0.95)
    assert not promote
    assert f"better in {noise:.1%}" in why and "95% of 500 resamples" in why
    # the setting that keeps the plain rule
    assert gate(_rmse(labels, twin), champion_rmse, "rmse", 0.0, False, noise, 0.0)[0]

    clear = paired_confidence("rmse", labels, better, champion, 0.0)
    assert clear >= 0.99
    assert gate(_rmse(labels, better), champion_rmse, "rmse", 0.0, False, clear, 0.95)[0]


def test_the_same_answers_are_never_better_and_the_margin_counts_in_each_resample():
    labels, champion, _, better = _regression()
    assert paired_confidence("rmse", labels, champion, champion, 0.0) == 0.0
    gain = _rmse(labels, champion) - _rmse(labels, better)
    assert paired_confidence("rmse", labels, better, champion, gain * 0.5) > 0.9
    assert paired_confidence("rmse", labels, better, champion, gain * 2) == 0.0
    # seeded: the same rows give the same decision
    _, _, twin, _ = _regression()
    assert paired_confidence("rmse", labels, twin, champion, 0.0) == paired_confidence("rmse", labels, twin, champion, 0.0)


@pytest.mark.parametrize("metric", ["mae", "acc_0_5", "acc_1_0"])
def test_every_regression_metric_sees_the_clear_improvement_and_not_the_reverse(metric):
    labels, champion, _, better = _regression()
    assert paired_confidence(metric, labels, better, champion, 0.0) > 0.95
    assert paired_confidence(metric, labels, champion, better, 0.0) < 0.05


def _probabilities(labels: list[int], right: float, seed: int) -> list[list[float]]:
    """Three-class probabilities that put 0.7 on the right class in a share ``right`` of rows."""
    generator = random.Random(seed)
    rows = []
    for label in labels:
        row = [0.1, 0.1, 0.1]
        row[label if generator.random() < right else generator.randrange(3)] += 0.7
        rows.append(row)
    return rows


@pytest.mark.parametrize("metric", ["log_loss", "accuracy", "macro_f1"])
def test_classification_metrics_tell_skill_from_noise(metric):
    generator = random.Random(3)
    labels = [generator.randrange(3) for _ in range(ROWS)]
    champion, skilled = _probabilities(labels, 0.6, 1), _probabilities(labels, 0.8, 2)
    assert paired_confidence(metric, labels, skilled, champion, 0.0) > 0.99
    assert paired_confidence(metric, labels, champion, skilled, 0.0) < 0.01
    # against a champion that knows nothing (a third for each class), skill is sure
    assert paired_confidence(metric, labels, champion, [[1 / 3] * 3] * ROWS, 0.0) > 0.99


def test_a_table_of_many_rows_is_resampled_m_out_of_n_and_still_tells_a_small_real_gain():
    """Beyond RESAMPLE_ROWS rows, each resample draws that many and scales the spread: a gain of one
    part in a hundred, sure on 20,000 rows, is seen though a resample has a quarter of them."""
    generator = random.Random(11)
    rows = RESAMPLE_ROWS * 4
    labels = [generator.uniform(0, 10) for _ in range(rows)]
    champion = [label + generator.gauss(0, 1) for label in labels]
    slightly = [label + (answer - label) * 0.99 for label, answer in zip(labels, champion)]
    assert paired_confidence("rmse", labels, slightly, champion, 0.0) == 1.0
    twin = [label + generator.gauss(0, 1) for label in labels]
    assert 0.0 < paired_confidence("rmse", labels, twin, champion, 0.0) < 1.0


def test_answers_not_paired_with_the_labels_are_refused():
    with pytest.raises(ValueError, match="paired answers needed: 3 labels, 2 and 3 answers"):
        paired_confidence("rmse", [1.0, 2.0, 3.0], [1.0, 2.0], [1.0, 2.0, 3.0], 0.0)


def test_one_models_answers_differing_in_the_last_digits_are_a_tie_not_a_sure_win():
    """The same model's answers as its file keeps them and as its endpoint sends them differ far down
    the digits (float32 in the model, float64 in the file): seen once as "better in 94.6%" of
    resamples of two equal RMSEs, which must not promote."""
    labels, champion, _, _ = _regression()
    shaved = [answer - 1e-9 * (answer - label) for label, answer in zip(labels, champion)]
    assert _rmse(labels, shaved) < _rmse(labels, champion)  # by a hair of floating point
    assert paired_confidence("rmse", labels, shaved, champion, 0.0) == 0.0
    assert not gate(_rmse(labels, shaved), _rmse(labels, champion), "rmse", 0.0, False, None, 0.0)[0]
