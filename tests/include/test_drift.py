"""Drift reports: the training reference's bins, the population stability index per column, the verdict.

The tables are generated here: a skewed and a normal measurement, a discrete count, a category and
a boolean, drawn the same way for training and for the files to score (then shifted, or not).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from airflow_ray_ml_stages.drift import (DriftCounter, categorical_reference, drift_report, numeric_reference, psi,
                                         training_reference)

NUMERIC = ("acidity", "alcohol", "visits", "organic")
COLOURS = ("red", "white", "rosé")


def _table(rows: int, seed: int) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    return {
        "acidity": generator.lognormal(1.0, 0.4, rows),
        "alcohol": generator.normal(10.5, 1.2, rows),
        "visits": generator.poisson(2.0, rows).astype("float64"),  # a few distinct values: tied deciles
        "organic": (generator.random(rows) < 0.3).astype("float64"),  # a boolean as 1/0
        "colour": generator.choice(COLOURS[:2], rows, p=[0.25, 0.75]).astype(object),
    }


def _reference(table: dict[str, np.ndarray]) -> dict[str, dict]:
    reference = {column: numeric_reference(table[column], 0, len(table[column])) for column in NUMERIC}
    colours, counts = np.unique(table["colour"], return_counts=True)
    reference["colour"] = categorical_reference(dict(zip(colours, counts.tolist())), 0, len(table["colour"]))
    return reference


def _report(reference: dict, table: dict[str, np.ndarray], missing: dict[str, np.ndarray] | None = None) -> dict:
    rows = len(table["alcohol"])
    missing = {column: np.zeros(rows, dtype=bool) for column in table} | (missing or {})
    counter = DriftCounter(reference)
    for start in range(0, rows, 700):  # batch by batch, as the score stage reads a file
        part = slice(start, start + 700)
        counter.add({column: values[part] for column, values in table.items()}, len(table["alcohol"][part]),
                    {column: absent[part] for column, absent in missing.items()})
    return drift_report(counter, watch=0.1, alert=0.25)


def test_a_file_drawn_from_the_training_distribution_is_stable_on_every_column():
    reference = _reference(_table(20_000, seed=1))
    report = _report(reference, _table(3_000, seed=2))
    assert report["verdict"] == "stable" and report["drifted"] == [] and report["reason"] == ""
    assert report["rows"] == 3_000
    assert all(entry["psi"] < 0.05 and entry["verdict"] == "stable" for entry in report["columns"].values()), report
    assert report["columns"]["colour"]["unseen"] == 0.0


def test_two_columns_moved_by_two_standard_deviations_and_an_unseen_category_drift_and_nothing_else():
    training = _table(20_000, seed=1)
    reference = _reference(training)
    shifted = _table(3_000, seed=2)
    shifted["alcohol"] = shifted["alcohol"] + 2 * training["alcohol"].std()
    shifted["acidity"] = shifted["acidity"] - 2 * training["acidity"].std()
    shifted["colour"][::10] = "rosé"  # a tenth of the file: a category training never saw
    report = _report(reference, shifted)
    assert report["verdict"] == "drift"
    assert set(report["drifted"]) == {"alcohol", "acidity", "colour"}
    assert report["columns"]["visits"]["verdict"] == report["columns"]["organic"]["verdict"] == "stable"
    assert report["columns"]["colour"]["unseen"] == pytest.approx(0.1, abs=1e-3)
    # worst first, as the run note names them
    psis = [report["columns"][column]["psi"] for column in report["drifted"]]
    assert psis == sorted(psis, reverse=True)
    first = report["drifted"][0]
    assert report["reason"].startswith(f"drift in {first} (PSI {report['columns'][first]['psi']:.2f}), ")


def test_a_share_of_missing_values_training_never_had_is_drift_on_that_column():
    reference = _reference(_table(20_000, seed=1))
    table = _table(3_000, seed=2)
    absent = np.random.default_rng(3).random(3_000) < 0.4
    report = _report(reference, table, {"visits": absent})
    assert report["drifted"] == ["visits"]
    assert report["columns"]["visits"]["missing"] == pytest.approx(absent.mean(), abs=1e-4)
    assert report["columns"]["visits"]["training_missing"] == 0.0


def test_a_column_that_misses_as_often_as_in_training_is_stable():
    training = _table(20_000, seed=1)
    reference = _reference(training)
    reference["alcohol"] = numeric_reference(training["alcohol"][3_000:], 3_000, 20_000)  # 15 % missing
    table = _table(4_000, seed=2)
    report = _report(reference, table, {"alcohol": np.random.default_rng(4).random(4_000) < 0.15})
    assert report["columns"]["alcohol"]["verdict"] == "stable", report["columns"]["alcohol"]


def test_a_discrete_column_gets_one_bin_per_tied_decile_and_a_boolean_two():
    training = _table(20_000, seed=1)
    visits = numeric_reference(training["visits"], 0, 20_000)
    assert visits["edges"] == sorted(set(visits["edges"])) and len(visits["edges"]) < 9
    assert sum(visits["shares"]) == pytest.approx(1.0)
    organic = numeric_reference(training["organic"], 0, 20_000)
    assert organic["edges"] == [0.0, 1.0] and organic["shares"][0] == pytest.approx(0.7, abs=0.02)


def test_psi_is_zero_for_equal_shares_and_counts_an_empty_bin_as_rare_not_impossible():
    assert psi([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == 0.0
    one_new = psi([0.45, 0.45, 0.1], [0.5, 0.5, 0.0])
    assert 0.25 < one_new < 2.0  # a tenth in a bin training never filled: drift, but a finite number


def test_the_reference_comes_from_the_data_stages_training_summary_only():
    """What the data stage hands over: the training split's rows, a sample of each numeric column's
    present values, its category counts and each column's missing count."""
    train = {"rows": 10, "drift_samples": [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]],
             "categories": {"colour": {"red": 3, "white": 5}}, "missing": {"alcohol": 2, "colour": 2}}
    reference = training_reference(train, ["alcohol"], ["colour"])
    assert reference["alcohol"]["missing"] == reference["colour"]["missing"] == 0.2
    assert reference["colour"]["categories"] == {"red": 3 / 8, "white": 5 / 8}
    assert min(reference["alcohol"]["edges"]) >= 1.0 and max(reference["alcohol"]["edges"]) <= 8.0


def _rents(rows: int, seed: int) -> pd.DataFrame:
    """A table that is not wine: a fifth of ``area`` missing, a boolean ``balcony`` (yes/no), a
    district with a few empty values, the rent to predict."""
    generator = np.random.default_rng(seed)
    table = pd.DataFrame({"area": generator.gamma(4.0, 18.0, rows),
                          "balcony": generator.choice(["yes", "no"], rows, p=[0.4, 0.6]),
                          "district": generator.choice(["north", "south", "east"], rows, p=[0.5, 0.3, 0.2])})
    table["rent"] = 9.5 * table["area"] + np.where(table["balcony"] == "yes", 60.0, 0.0) + generator.normal(0, 40, rows)
    table.loc[generator.random(rows) < 0.2, "area"] = np.nan
    table.loc[generator.random(rows) < 0.05, "district"] = ""
    return table


def test_the_data_stage_keeps_the_training_distributions_and_a_new_file_is_measured_against_them(tmp_path):
    """The real path on a table that is not wine, without a cluster: the data stage's reference in the
    preprocessor (a numeric column with missing values, a boolean, a category with empty values) and
    the score stage's count of a CSV file into it."""
    from airflow_ray_ml_stages.data.stage import run_preprocess
    from airflow_ray_ml_stages.preprocessor import Preprocessor
    from airflow_ray_ml_stages.score import drift_counts
    from airflow_ray_ml_stages.specs import PreprocessSpec

    (tmp_path / "rents.csv").write_text(_rents(4000, seed=1).to_csv(index=False))
    result = run_preprocess(PreprocessSpec(source=[str(tmp_path / "rents.csv")], label_column="rent",
                                           artifact_dir=str(tmp_path / "data"), categorical_columns=["district"]))
    reference = Preprocessor.load(result.preprocessor_uri).reference
    assert set(reference) == {"area", "balcony", "district"}
    assert reference["area"]["missing"] == pytest.approx(0.2, abs=0.03)  # the training split's own share
    assert reference["balcony"]["edges"] == [0.0, 1.0] and reference["balcony"]["missing"] == 0.0
    assert set(reference["district"]["categories"]) == {"north", "south", "east"}
    assert reference["district"]["missing"] == pytest.approx(0.05, abs=0.02)
    for variant in result.preprocessor_variants.values():  # every scaler's preprocessor carries it
        assert Preprocessor.load(variant).reference == reference

    def report(table: pd.DataFrame, name: str) -> dict:
        path = tmp_path / f"{name}.csv"
        table.drop(columns=["rent"]).to_csv(path, index=False)
        return drift_report(drift_counts([str(path)], "csv", ",", False, Preprocessor.load(result.preprocessor_uri),
                                         10**6), watch=0.1, alert=0.25)

    same = report(_rents(2000, seed=2), "same")
    assert same["verdict"] == "stable", same["columns"]
    emptier = _rents(2000, seed=3)
    emptier.loc[emptier.index[::2], "district"] = ""  # half the districts missing now
    emptier["balcony"] = "yes"  # and every flat has a balcony
    moved = report(emptier, "moved")
    assert set(moved["drifted"]) == {"district", "balcony"}, moved["columns"]
    assert moved["columns"]["district"]["missing"] == pytest.approx(0.5, abs=0.03)
    assert moved["columns"]["area"]["verdict"] == "stable"
