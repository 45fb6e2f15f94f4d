"""The generated wine-quality stand-in: UCI schema, seeded, realistic, learnable."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_ray_ml_stages import wine


@pytest.fixture(scope="module")
def frame():
    return wine.generate(rows=6497, seed=7)


def test_generate_has_uci_schema_and_type(frame):
    assert list(frame.columns) == [wine.TYPE_COLUMN, *wine.UCI_COLUMNS]
    assert frame[wine.LABEL].dtype.kind == "i"
    assert set(frame[wine.TYPE_COLUMN]) == {"red", "white"}


def test_generate_keeps_the_published_red_white_split(frame):
    counts = frame[wine.TYPE_COLUMN].value_counts()
    assert (counts["red"], counts["white"]) == (1599, 4898)


def test_generate_same_seed_same_rows_other_seed_other_rows():
    assert wine.generate(500, seed=1).equals(wine.generate(500, seed=1))
    assert not wine.generate(500, seed=1).equals(wine.generate(500, seed=2))


def test_generate_ranges_and_grades_are_plausible(frame):
    assert frame.notna().all().all()
    assert frame["pH"].between(2.7, 4.1).all() and frame["density"].between(0.985, 1.04).all()
    assert frame["citric acid"].min() >= 0 and frame["alcohol"].between(8, 15).all()
    assert frame[wine.LABEL].between(3, 9).all()
    grades = frame[wine.LABEL].value_counts(normalize=True)
    assert grades[5] + grades[6] > 0.6  # like the real data, most wines are 5 or 6
    by_type = frame.groupby(wine.TYPE_COLUMN).mean(numeric_only=True)
    assert by_type.loc["white", "residual sugar"] > 2 * by_type.loc["red", "residual sugar"]
    assert by_type.loc["red", "volatile acidity"] > by_type.loc["white", "volatile acidity"]


def test_generate_correlations_follow_the_real_data(frame):
    white = frame[frame[wine.TYPE_COLUMN] == "white"]
    corr = white[list(wine.FEATURES) + [wine.LABEL]].corr()
    assert corr.loc["density", "residual sugar"] > 0.7
    assert corr.loc["density", "alcohol"] < -0.5
    assert corr.loc["free sulfur dioxide", "total sulfur dioxide"] > 0.4
    assert corr.loc["alcohol", wine.LABEL] > 0.3


def test_generate_quality_is_learnable_but_noisy(frame):
    features = frame[list(wine.FEATURES)].to_numpy()
    features = (features - features.mean(0)) / features.std(0)
    design = np.c_[np.ones(len(frame)), features]
    target = frame[wine.LABEL].to_numpy(float)
    train, test = slice(0, None, 2), slice(1, None, 2)
    coefficients = np.linalg.lstsq(design[train], target[train], rcond=None)[0]
    rmse = np.sqrt(np.mean((design[test] @ coefficients - target[test]) ** 2))
    baseline = np.sqrt(np.mean((target[train].mean() - target[test]) ** 2))
    assert rmse < 0.85 * baseline  # a linear model learns a good part of it ...
    assert rmse > 0.4  # ... but not all: the grades carry noise, as tasters' grades do


def test_to_uci_csv_is_semicolon_with_quoted_header(frame):
    text = wine.to_uci_csv(frame.head(3)).decode()
    header, first = text.splitlines()[:2]
    assert header.startswith('"fixed acidity";"volatile acidity"') and header.endswith('"quality"')
    assert len(first.split(";")) == 12 and "type" not in header


@pytest.mark.parametrize(("label", "endpoint"), [
    (None, ("wine-quality", "/wine")),
    ("quality", ("wine-quality", "/wine")),
    ("Monthly Rent", ("monthly-rent", "/monthly-rent")),
    ("__prix (€)", ("prix", "/prix")),
    ("€€", ("model", "/model")),
    ("x" * 80, ("x" * 63, "/" + "x" * 63)),
])
def test_serve_endpoint_demo_label_keeps_the_demo_app_others_name_their_own(label, endpoint):
    assert wine.serve_endpoint(label) == endpoint
