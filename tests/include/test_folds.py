"""The tune stage's cross-validation folds: dealt evenly, stratified by class, and written without overlap."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_ray_ml_stages.folds import fold_of_rows, write_folds
from tests.train_data import load_split, write_preprocessed


def test_folds_are_even_and_keep_each_class_share():
    labels = np.array([0] * 50 + [1] * 37 + [2] * 13, dtype=np.float64)
    generator = np.random.default_rng(3)
    labels = labels[generator.permutation(len(labels))]
    assignment = fold_of_rows(labels, 5, seed=1, classification=True)
    sizes = np.bincount(assignment, minlength=5)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 100
    for value, count in ((0, 50), (1, 37), (2, 13)):
        per_fold = np.bincount(assignment[labels == value], minlength=5)
        assert per_fold.max() - per_fold.min() <= 1 and per_fold.sum() == count


def test_folds_follow_the_seed_and_regression_is_dealt_by_row():
    labels = np.linspace(0, 1, 23)
    first = fold_of_rows(labels, 4, seed=5, classification=False)
    assert np.array_equal(first, fold_of_rows(labels, 4, seed=5, classification=False))
    assert not np.array_equal(first, fold_of_rows(labels, 4, seed=6, classification=False))
    assert sorted(np.bincount(first)) == [5, 6, 6, 6]


def test_written_folds_pool_train_and_validation_and_never_the_test_split(tmp_path):
    data = write_preprocessed(tmp_path / "data", rows=400, seed=4)
    features, label = data["feature_columns"], data["label_column"]
    uris = write_folds(data["split_uris"]["train"], data["split_uris"]["validation"], [*features, label], label,
                       folds=3, seed=0, classification=False, target=str(tmp_path / "tune"))
    pooled = {tuple(row) for split in ("train", "validation")
              for row in load_split(data["split_uris"][split], features, label)[0]}
    test = {tuple(row) for row in load_split(data["split_uris"]["test"], features, label)[0]}
    held_out = set()
    for fold in uris:
        train = {tuple(row) for row in load_split(fold["train"], features, label)[0]}
        validation = {tuple(row) for row in load_split(fold["validation"], features, label)[0]}
        assert not train & validation and train | validation == pooled and not (train | validation) & test
        held_out |= validation
    assert held_out == pooled and len(uris) == 3


@pytest.mark.parametrize("folds", [1, -1])
def test_tune_spec_refuses_a_single_fold(folds):
    from airflow_ray_ml_stages.errors import SpecError
    from airflow_ray_ml_stages.specs import TuneSpec
    from tests.include.test_tune import DATA

    with pytest.raises(SpecError, match="cv_folds"):
        TuneSpec(**DATA, cv_folds=folds)


def test_cross_validation_where_the_validation_split_is_small_or_a_class_rare_and_the_table_not_large():
    from airflow_ray_ml_stages.folds import cross_validation_reason

    many, few = np.zeros(300), np.zeros(299)
    assert "299 rows" in cross_validation_reason(few, None, 2000, 5, 20000)
    assert cross_validation_reason(many, None, 2000, 5, 20000) is None
    assert cross_validation_reason(few, None, 20001, 5, 20000) is None  # too large to train 5 times
    assert cross_validation_reason(few, None, 2000, 0, 20000) is None  # turned off
    assert "3 rows" in cross_validation_reason(np.zeros(3), None, 10, 5, 20000)
    assert cross_validation_reason(np.zeros(3), None, 9, 5, 20000) is None  # too few rows for 5 folds
    rare = np.array([0] * 1450 + [1] * 50)
    assert "50 rows of class 'Yes'" in cross_validation_reason(rare, ["No", "Yes"], 8500, 5, 20000)
    absent = np.array([0] * 200 + [2] * 200)  # a class the validation split lacks is rarest of all
    assert "0 rows of class 'b'" in cross_validation_reason(absent, ["a", "b", "c"], 2600, 5, 20000)
    assert cross_validation_reason(np.array([0] * 200 + [1] * 200), ["a", "b"], 2600, 5, 20000) is None
