"""The data stage with task="classification": classes, the stratified split, class indexes, label checks.

The direct engine runs in-process (no Ray); the Ray Data engine runs against the session's real Ray
cluster in one driver process, and must write what the direct engine writes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from airflow_ray_ml_stages import wine
from airflow_ray_ml_stages.data.split import STRATA_BINS, stratified_cuts
from airflow_ray_ml_stages.data.stage import run_preprocess
from airflow_ray_ml_stages.errors import DataSourceError
from airflow_ray_ml_stages.preprocessor import Preprocessor
from airflow_ray_ml_stages.specs import PreprocessSpec
from tests.include.test_data import run_in_ray_driver

SPLITS = ("train", "validation", "test")
FRACTIONS = [0.7, 0.15, 0.15]
TEXT_CLASSES = ["churned", "rare", "stayed"]


def _text_frame(rows: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Three text classes, one of them with 3 rows, and a categorical feature."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"tenure": rng.normal(24, 6, rows).round(2), "spend": rng.gamma(2.0, 30.0, rows).round(2),
                          "plan": rng.choice(["basic", "pro"], rows)})
    frame["outcome"] = np.where(frame["spend"] > 60, "churned", "stayed")
    frame.loc[[10, rows // 6, rows // 3 * 2], "outcome"] = "rare"
    return frame


def _spec(tmp_path, name: str, source, **fields) -> PreprocessSpec:
    return PreprocessSpec(source=[str(path) for path in (source if isinstance(source, list) else [source])],
                          artifact_dir=str(tmp_path / "out" / name), task="classification",
                          **{"engine": "direct", **fields})


def _written(result, name: str) -> pd.DataFrame:
    table = pd.read_parquet(result.split_uris[name]) if result.split_uris[name] else pd.DataFrame()
    return table


def _sorted_split(result, name: str) -> pd.DataFrame:
    table = pd.read_parquet(result["split_uris"][name] if isinstance(result, dict) else result.split_uris[name])
    columns = sorted(table.columns.drop("split", errors="ignore"))
    return table[columns].round(9).sort_values(columns).reset_index(drop=True)


@pytest.fixture(scope="module")
def text_csv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clf_text")
    frame = _text_frame()
    frame.to_csv(folder / "churn.csv", index=False)
    return folder / "churn.csv", frame


# -- the cut points ------------------------------------------------------------------------------

@pytest.mark.parametrize(("rows_per_bin", "expected"), [
    ({500: 1}, (501, 501)),            # one row: it trains
    ({100: 1, 900: 1}, (101, 901)),     # two rows: one trains, one validates
    ({5: 1, 6: 1, 7: 1}, (7, 8)),       # three rows: 2 / 1 / 0 (0.7 * 3 = 2.1, 0.85 * 3 = 2.55 -> 3)
])
def test_stratified_cuts_small_class_trains_first(rows_per_bin, expected):
    histogram = np.zeros(STRATA_BINS, dtype="int64")
    for position, count in rows_per_bin.items():
        histogram[position] = count
    assert stratified_cuts(histogram, FRACTIONS) == expected


def test_stratified_cuts_large_class_meets_the_fractions_to_within_a_bin():
    rng = np.random.default_rng(1)
    bins = rng.integers(0, STRATA_BINS, 50_000)
    histogram = np.bincount(bins, minlength=STRATA_BINS)
    train_end, validation_end = stratified_cuts(histogram, [0.6, 0.3, 0.1])
    per_bin = histogram.max()
    assert abs((bins < train_end).sum() - 30_000) <= per_bin
    assert abs((bins < validation_end).sum() - 45_000) <= per_bin


# -- text labels, direct engine ------------------------------------------------------------------

def test_classification_text_label_classes_sorted_indexes_written_and_every_class_trains(text_csv, tmp_path):
    path, frame = text_csv
    result = run_preprocess(_spec(tmp_path, "text", path, label_column="outcome", split=FRACTIONS))
    assert result.task == "classification" and result.classes == TEXT_CLASSES
    assert sum(result.rows.values()) == len(frame)
    counts = {name: _written(result, name)["outcome"].value_counts().to_dict() for name in SPLITS}
    train = _written(result, "train")
    assert train["outcome"].dtype == np.int64 and set(train["outcome"]) == {0, 1, 2}
    assert counts["train"][1] == 2 and counts["validation"].get(1, 0) == 1  # the 3-row class: 2 / 1 / 0
    totals = frame["outcome"].value_counts()
    for index, name in enumerate(TEXT_CLASSES):
        if name == "rare":
            continue
        for split, fraction in zip(SPLITS, FRACTIONS):
            assert counts[split][index] / totals[name] == pytest.approx(fraction, abs=0.01), (name, split)
    # The label indexes name the right rows: re-derive each written row's class from its raw values.
    fitted = Preprocessor.load(result.preprocessor_uri)
    raw = frame.assign(expected=frame["outcome"].map({c: i for i, c in enumerate(TEXT_CLASSES)}))
    served = fitted.transform(raw).round(6).assign(outcome=raw["expected"].to_numpy())
    written = pd.concat([_written(result, name) for name in SPLITS])[served.columns].round(6)
    key = list(served.columns)
    pd.testing.assert_frame_equal(served.sort_values(key).reset_index(drop=True),
                                  written.sort_values(key).reset_index(drop=True), check_dtype=False)


def test_classification_preprocessors_manifest_and_profile_carry_task_and_classes(text_csv, tmp_path):
    path, frame = text_csv
    result = run_preprocess(_spec(tmp_path, "text", path, label_column="outcome"))
    for uri in [result.preprocessor_uri, *result.preprocessor_variants.values()]:
        data = json.loads(open(uri).read())
        assert data["task"] == "classification" and data["classes"] == TEXT_CLASSES, uri
        assert Preprocessor.load(uri).classes == TEXT_CLASSES
    assert "outcome" not in result.feature_columns and "plan=pro" in result.feature_columns
    profile = json.load(open(result.profile_uri))
    label = profile["label"]
    assert label["classes"] == TEXT_CLASSES and label["text"] is True and label["threshold"] is None
    for name in SPLITS:
        written = _written(result, name)["outcome"].value_counts()
        assert label["class_counts"][name] == {c: int(written.get(i, 0)) for i, c in enumerate(TEXT_CLASSES)}
    assert "outcome" not in profile["columns"]  # a text label has no numeric statistics
    assert profile["split"]["method"].startswith("stratified")
    assert profile["rows"]["train"] == result.rows["train"]


def test_classification_split_depends_only_on_content_not_files_order_or_format(text_csv, tmp_path):
    path, frame = text_csv
    whole = run_preprocess(_spec(tmp_path, "whole", path, label_column="outcome"))
    shuffled = frame.sample(frac=1.0, random_state=3)
    shards = []
    for index, rows in enumerate(np.array_split(np.arange(len(shuffled)), 4)):
        shards.append(tmp_path / f"shard-{index}.csv")
        shuffled.iloc[rows].to_csv(shards[-1], index=False)
    sharded = run_preprocess(_spec(tmp_path, "shards", shards, label_column="outcome"))
    frame.to_parquet(tmp_path / "churn.parquet", index=False)
    parquet = run_preprocess(_spec(tmp_path, "parquet", tmp_path / "churn.parquet", label_column="outcome"))
    assert whole.rows == sharded.rows == parquet.rows
    for name in SPLITS:
        pd.testing.assert_frame_equal(_sorted_split(whole, name), _sorted_split(sharded, name))
        pd.testing.assert_frame_equal(_sorted_split(whole, name), _sorted_split(parquet, name))


def test_classification_missing_text_labels_follow_nan_policy(tmp_path):
    frame = _text_frame(400)
    frame.loc[[3, 7], "outcome"] = ""
    frame.loc[9, "outcome"] = "NA"
    frame.to_csv(tmp_path / "gaps.csv", index=False)
    with pytest.raises(DataSourceError, match=r"column 'outcome' has 3 NaN, infinite or missing value\(s\)"):
        run_preprocess(_spec(tmp_path, "fail", tmp_path / "gaps.csv", label_column="outcome", nan_policy="fail"))
    # a label cannot be imputed: with the default (impute) the rows without one are dropped and counted
    imputed = run_preprocess(_spec(tmp_path, "impute", tmp_path / "gaps.csv", label_column="outcome"))
    assert imputed.rows_dropped == 3
    result = run_preprocess(_spec(tmp_path, "drop", tmp_path / "gaps.csv", label_column="outcome", nan_policy="drop"))
    assert result.rows_dropped == 3 and result.classes == TEXT_CLASSES


# -- numeric labels ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wine_csv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clf_wine")
    frame = wine.generate(rows=2000, seed=1)
    frame.to_csv(folder / "wine.csv", index=False)
    return folder / "wine.csv", frame


def test_classification_integer_label_gives_its_grades_as_sorted_integer_classes(wine_csv, tmp_path):
    path, frame = wine_csv
    result = run_preprocess(_spec(tmp_path, "grades", path, label_column=wine.LABEL, label_range=[0, 10]))
    grades = sorted(int(v) for v in frame["quality"].unique())
    assert result.classes == grades and all(type(c) is int for c in result.classes)
    assert json.loads(json.dumps(result.to_dict()))["classes"] == grades  # JSON integers
    written = pd.concat([_written(result, name) for name in SPLITS])
    expected = frame["quality"].map({g: i for i, g in enumerate(grades)}).value_counts().sort_index()
    assert written["quality"].value_counts().sort_index().to_dict() == expected.to_dict()
    train = _written(result, "train")["quality"].value_counts()
    assert all(train.get(index, 0) >= 1 for index in range(len(grades)))  # the 6-row grade 3 trains too
    profile = json.load(open(result.profile_uri))
    assert profile["label"]["classes"] == grades and profile["label"]["text"] is False
    assert profile["columns"]["quality"]["min"] == frame["quality"].min()  # raw label statistics kept


def test_classification_label_threshold_gives_two_classes_from_the_raw_label(wine_csv, tmp_path):
    path, frame = wine_csv
    result = run_preprocess(_spec(tmp_path, "good", path, label_column=wine.LABEL, label_threshold=7,
                                  label_range=[0, 10]))
    assert result.classes == [0, 1]
    written = pd.concat([_written(result, name) for name in SPLITS])
    assert written["quality"].value_counts().to_dict() == (frame["quality"] >= 7).astype(int).value_counts().to_dict()
    profile = json.load(open(result.profile_uri))
    assert profile["label"]["threshold"] == 7
    assert sum(profile["label"]["class_counts"]["train"].values()) == result.rows["train"]
    # label_range checks the raw label, before the threshold.
    frame.assign(quality=frame["quality"].where(frame.index != 5, 42)).to_csv(tmp_path / "range.csv", index=False)
    with pytest.raises(DataSourceError, match=r"outside label_range \[0, 10\]"):
        run_preprocess(_spec(tmp_path, "range", tmp_path / "range.csv", label_column=wine.LABEL, label_threshold=7,
                             label_range=[0, 10]))


# -- bad labels ----------------------------------------------------------------------------------

def _bad_frame(tmp_path, name: str, label) -> str:
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"x": rng.normal(size=300), "label": label})
    frame.to_csv(tmp_path / name, index=False)
    return tmp_path / name


@pytest.mark.parametrize(("label", "fields", "message"), [
    (np.resize([5.0, 5.5, 6.0], 300), {},
     ["label column 'label' has 100 non-integer value(s)", '"label": 5.5', "use task='regression'", "label_threshold"]),
    (np.full(300, "yes"), {}, ["only one class ['yes']", "classification needs at least two classes"]),
    (np.full(300, 4), {"label_threshold": 7}, ["only one class [0]", "another label_threshold than 7"]),
    (np.resize(["yes", "no"], 300), {"label_threshold": 1},
     ["label_threshold=1 makes two classes of a numeric label", "holds text, e.g. ['no', 'yes']", "drop label_threshold"]),
    (np.resize(["yes", "no"], 300), {"label_range": [0, 1]}, ["label_range=[0, 1] checks a numeric label"]),
    (np.arange(300), {"max_categories": 20},
     ["more distinct classes than max_categories=20", "e.g. [0, 1, 2, 3, 4]", "task='regression'"]),
])
def test_classification_bad_label_fails_before_writing_and_names_the_fix(tmp_path, label, fields, message):
    path = _bad_frame(tmp_path, "bad.csv", label)
    spec = _spec(tmp_path, "bad", path, label_column="label", **fields)
    with pytest.raises(DataSourceError) as raised:
        run_preprocess(spec)
    for part in message:
        assert part in str(raised.value), str(raised.value)
    assert not os.path.exists(os.path.join(spec.artifact_dir, "splits"))


def test_regression_text_label_stays_a_non_numeric_error_that_suggests_classification(tmp_path):
    path = _bad_frame(tmp_path, "text.csv", np.resize(["yes", "no"], 300))
    with pytest.raises(DataSourceError, match=r"'label' must be numeric.*set task='classification'"):
        run_preprocess(PreprocessSpec(source=[str(path)], label_column="label", artifact_dir=str(tmp_path / "out")))


def test_classification_label_numeric_at_first_then_text_says_to_make_it_all_text(tmp_path):
    path = _bad_frame(tmp_path, "mixed.csv", [*range(3)] * 60 + ["many"] * 120)
    with pytest.raises(DataSourceError, match=r"'label' must be numeric.*\['many'\].*read as text only when its first rows"):
        run_preprocess(_spec(tmp_path, "mixed", path, label_column="label"))


# -- the Ray Data engine writes what the direct engine writes ------------------------------------



@pytest.mark.integration
def test_classification_ray_data_and_direct_engines_write_the_same_splits(ray_cluster, text_csv, wine_csv, tmp_path):
    cases = {"text": {"source": [str(text_csv[0])], "label_column": "outcome"},
             "grades": {"source": [str(wine_csv[0])], "label_column": wine.LABEL},
             "threshold": {"source": [str(wine_csv[0])], "label_column": wine.LABEL, "label_threshold": 7},
             "bad": {"source": [str(_bad_frame(tmp_path, "bad.csv", np.resize([5.0, 5.5], 300)))],
                     "label_column": "label"}}
    specs = {}
    for name, fields in cases.items():
        specs[name] = {**fields, "task": "classification", "engine": "ray_data", "override_num_blocks": 3,
                       "artifact_dir": str(tmp_path / "ray" / name)}
    outcomes = run_in_ray_driver(ray_cluster, specs, tmp_path)
    assert "non-integer value(s)" in outcomes["bad"]["error"] and "use task='regression'" in outcomes["bad"]["error"]
    for name in ("text", "grades", "threshold"):
        assert "error" not in outcomes[name], outcomes[name]
        on_ray = outcomes[name]["result"]
        direct = run_preprocess(PreprocessSpec(**{**specs[name], "engine": "direct",
                                                  "artifact_dir": str(tmp_path / "direct" / name)}))
        assert on_ray["classes"] == direct.classes and on_ray["rows"] == direct.rows, name
        assert json.load(open(on_ray["profile_uri"]))["engine"]["name"] == "ray_data"
        assert (json.load(open(on_ray["profile_uri"]))["label"]
                == json.load(open(direct.profile_uri))["label"])
        assert Preprocessor.load(on_ray["preprocessor_uri"]).classes == direct.classes
        for split in SPLITS:
            pd.testing.assert_frame_equal(_sorted_split(on_ray, split), _sorted_split(direct, split), check_dtype=False)
            assert pd.read_parquet(on_ray["split_uris"][split])[direct.label_column].dtype == np.int64
