"""Missing values end to end without a cluster: nan_policy='impute' in the data stage, the served model, batch scoring."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from airflow_ray_ml_stages.errors import DataSourceError, SpecError
from airflow_ray_ml_stages.preprocessor import Preprocessor, inverse_transform
from airflow_ray_ml_stages.specs import PreprocessSpec, ScoreSpec, TrainSpec
from tests.conftest import requires_ml_extra, skip_without_ml_extra


def _table(rows: int = 1200, seed: int = 3) -> pd.DataFrame:
    """``id`` (unique: finds a written row's raw one), ``x`` (a fifth missing), ``c`` (a tenth empty), ``y``."""
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"id": np.arange(rows, dtype=float), "x": rng.gamma(2.0, 3.0, size=rows),
                          "c": rng.choice(["a", "b", "b", "c"], size=rows)})
    table["y"] = table["x"] + np.where(table["c"] == "a", 5.0, 0.0) + rng.normal(size=rows)
    table.loc[rng.random(rows) < 0.2, "x"] = np.nan
    table.loc[rng.random(rows) < 0.1, "c"] = ""
    table.loc[11, "x"] = np.inf  # infinite: missing too
    table.loc[12, "y"] = np.nan  # no label: dropped, whatever the policy
    return table


def _preprocess(tmp_path, table: pd.DataFrame, name: str = "data", **fields):
    from airflow_ray_ml_stages.data.stage import run_preprocess

    path = tmp_path / f"{name}.csv"
    table.to_csv(path, index=False)
    categorical = ["c"] if "c" in table.columns else []  # c's empty values: a category's missing values
    return run_preprocess(PreprocessSpec(source=[str(path)], label_column="y", artifact_dir=str(tmp_path / name),
                                         categorical_columns=categorical, **fields))


def _written(result, split: str, preprocessor: Preprocessor) -> pd.DataFrame:
    written = pd.read_parquet(result.split_uris[split])
    return written, inverse_transform(preprocessor, written)


def test_impute_fills_features_from_the_training_split_only(tmp_path):
    table = _table()
    result = _preprocess(tmp_path, table)  # impute is the default
    preprocessor = Preprocessor.load(result.preprocessor_uri)
    assert result.rows_dropped == 1 and sum(result.rows.values()) == len(table) - 1  # the row without a label
    written, raw = _written(result, "train", preprocessor)
    train_rows = table.set_index("id").loc[raw["id"].round().to_numpy()]
    present = train_rows["x"].replace(np.inf, np.nan).dropna()
    assert preprocessor.fill["x"] == pytest.approx(present.median())
    # the other splits' values never reach it: the whole table's median differs
    assert present.median() != pytest.approx(table["x"].replace(np.inf, np.nan).median())
    counts = train_rows.loc[train_rows["c"] != "", "c"].value_counts()
    assert preprocessor.fill["c"] == counts.idxmax() == "b"
    # The splits keep a missing value missing (NaN: XGBoost's own missing value; a category's in each of its
    # one-hot columns), and the fill vector is what imputing the raw value gives, in the splits' scaling.
    absent_x = np.isnan(train_rows["x"].to_numpy()) | np.isinf(train_rows["x"].to_numpy())
    absent_c = (train_rows["c"] == "").to_numpy()
    assert absent_x.any() and (written["x"].isna().to_numpy() == absent_x).all()
    assert (written[["c=a", "c=b", "c=c"]].isna().all(axis=1).to_numpy() == absent_c).all()
    imputed = preprocessor.transform(pd.DataFrame({"id": [preprocessor.fill["id"]], "x": [preprocessor.fill["x"]],
                                                   "c": [preprocessor.fill["c"]]}))
    fill = dict(zip(preprocessor.output_columns, preprocessor.fill_vector()))
    assert fill == pytest.approx(imputed.iloc[0].to_dict())
    # the scaler was fitted on the imputed training values
    filled_x = np.where(absent_x, preprocessor.fill["x"], train_rows["x"].to_numpy())
    assert preprocessor.statistics["x"]["mean"] == pytest.approx(filled_x.mean())
    assert preprocessor.statistics["x"]["std"] == pytest.approx(filled_x.std())
    profile = json.loads(open(result.profile_uri).read())
    assert profile["imputed_by_column"]["x"] == int(table["x"].isna().sum()) + 1  # NaN and the infinite one
    assert profile["imputed_by_column"]["c"] == int((table["c"] == "").sum())
    assert profile["dropped_by_column"] == {"y": 1}


def test_impute_refuses_a_column_with_no_training_value_and_fail_or_drop_keep_their_ways(tmp_path):
    table = _table(300)
    with pytest.raises(DataSourceError, match=r"column 'x' has \d+ NaN, infinite or missing.*nan_policy='impute'"):
        _preprocess(tmp_path, table, "fail", nan_policy="fail")
    dropped = _preprocess(tmp_path, table, "drop", nan_policy="drop")
    assert dropped.rows_dropped == int((table["x"].isna() | np.isinf(table["x"]) | (table["c"] == "")
                                        | table["y"].isna()).sum())
    assert Preprocessor.load(dropped.preprocessor_uri).fill == {}
    with pytest.raises(DataSourceError, match=r"column\(s\) \['x'\] have no value in any training row"):
        _preprocess(tmp_path, table.assign(x=np.nan), "empty")


@pytest.fixture(scope="module")
def imputing_model(tmp_path_factory):
    """A forest trained on imputed splits, and the table it came from."""
    skip_without_ml_extra()
    from airflow_ray_ml_stages.train.stage import run_training

    folder = tmp_path_factory.mktemp("impute")
    table = _table()
    result = _preprocess(folder, table.drop(columns=["id"]))
    trained = run_training(TrainSpec(
        artifact_dir=str(folder / "train"), train_uri=result.split_uris["train"],
        validation_uri=result.split_uris["validation"], test_uri=result.split_uris["test"],
        feature_columns=result.feature_columns, label_column="y", preprocessor_uri=result.preprocessor_uri,
        config={"family": "random_forest", "n_estimators": 30}))
    return trained.model_dir, table.drop(columns=["id"]), folder


def test_the_served_model_imputes_a_null_as_training_did(imputing_model):
    from airflow_ray_ml_stages.serve import LoadedModel

    model_dir, table, _ = imputing_model
    loaded = LoadedModel.load(model_dir)
    fill = loaded.preprocessor.fill
    rows = [{"x": None, "c": None}, {"x": fill["x"], "c": fill["c"]}, {"x": 4.0, "c": None}, {"x": 4.0, "c": fill["c"]}]
    frame, problems = loaded.check_body({"instances": rows})
    assert problems == []
    predicted = loaded.predict_frame(frame)
    assert predicted[0] == predicted[1] and predicted[2] == predicted[3]
    schema = loaded.request_schema["properties"]["instances"]["items"]["properties"]
    assert schema["x"]["type"] == ["number", "null"] and None in schema["c"]["enum"]
    _, problems = loaded.check_body({"instances": [{"x": "four", "c": "a"}]})
    assert problems[0]["msg"] == "must be a number or null, got 'four'"


def test_a_splits_rows_go_to_the_endpoint_with_null_for_a_missing_value(imputing_model):
    """What the deploy's smoke test and make run's sample send: a split's rows, raw, as JSON (NaN is not JSON)."""
    from airflow_ray_ml_stages.preprocessor import raw_split_rows
    from airflow_ray_ml_stages.serve import LoadedModel

    model_dir, _, folder = imputing_model
    loaded = LoadedModel.load(model_dir)
    rows, labels = raw_split_rows(str(folder / "data" / "splits" / "split=test"), loaded.preprocessor)
    assert len(rows) == len(labels) and any(row["x"] is None for row in rows) and any(row["c"] is None for row in rows)
    json.dumps(rows, allow_nan=False)  # what requests does with json=
    frame, problems = loaded.check_body({"instances": rows})
    assert problems == [] and np.isfinite(loaded.predict_frame(frame)).all()


def test_batch_scoring_imputes_as_the_model_was_trained_or_drops_and_counts(imputing_model, tmp_path):
    from airflow_ray_ml_stages.score import run_scoring

    model_dir, table, _ = imputing_model
    new = table.drop(columns=["y"]).head(200)
    gaps = int((new["x"].isna() | np.isinf(new["x"]) | (new["c"] == "")).sum())
    assert gaps
    new.to_csv(tmp_path / "new.csv", index=False)

    def score(name: str, **fields):
        return run_scoring(ScoreSpec(input_uri=str(tmp_path / "new.csv"), model_dir=model_dir,
                                     output_uri=str(tmp_path / name), artifact_dir=str(tmp_path / f"a-{name}"),
                                     **fields))

    imputed = score("imputed")  # missing_values='model': this model imputes
    assert imputed.missing_values == "impute" and imputed.rows == 200 and imputed.rows_dropped == 0
    scored = pd.concat(pd.read_csv(path) for path in sorted((tmp_path / "imputed").glob("*.csv")))
    assert scored["predicted_y"].notna().all()
    dropped = score("dropped", missing_values="drop")
    assert dropped.rows == 200 - gaps and dropped.rows_dropped == gaps
    with pytest.raises(DataSourceError, match=r"column 'x' has \d+ non-numeric, missing or infinite value"):
        score("failed", missing_values="fail")
    assert not (tmp_path / "failed").exists()


def test_batch_scoring_of_a_model_that_does_not_impute_drops_by_default_and_refuses_impute(tmp_path):
    from airflow_ray_ml_stages.score import missing_values_of

    assert missing_values_of("model", {}) == "drop" and missing_values_of("model", {"x": 1.0}) == "impute"
    assert missing_values_of("fail", {"x": 1.0}) == "fail"
    with pytest.raises(SpecError, match="trained without imputing"):
        missing_values_of("impute", {})


@requires_ml_extra
def test_xgboost_learns_from_missingness_itself_while_the_others_impute(tmp_path):
    """A label that says whether ``x`` is missing: XGBoost, given the splits' NaN, learns it and still reads a
    median ``x`` as a median; a forest, given the median in a missing value's place, answers a missing value and a
    median one alike. Served, each does as it trained."""
    from airflow_ray_ml_stages.serve import LoadedModel
    from airflow_ray_ml_stages.train.stage import run_training

    rng = np.random.default_rng(5)
    x = rng.uniform(0, 10, size=1500)
    table = pd.DataFrame({"x": x, "noise": rng.normal(size=1500), "y": x.copy()})
    gone = rng.random(1500) < 0.3
    table.loc[gone, "x"] = np.nan
    table.loc[gone, "y"] = 20.0
    result = _preprocess(tmp_path, table)
    fields = dict(train_uri=result.split_uris["train"], validation_uri=result.split_uris["validation"],
                  test_uri=result.split_uris["test"], feature_columns=result.feature_columns, label_column="y",
                  preprocessor_uri=result.preprocessor_uri)
    boosted = run_training(TrainSpec(**fields, artifact_dir=str(tmp_path / "xgb"),
                                     config={"family": "xgboost", "num_boost_round": 200}))
    forest = run_training(TrainSpec(**fields, artifact_dir=str(tmp_path / "forest"),
                                    config={"family": "extra_trees", "n_estimators": 30}))
    assert boosted.metrics["test"]["rmse"] < 0.5
    median = Preprocessor.load(result.preprocessor_uri).fill["x"]
    rows = [{"x": None, "noise": 0.0}, {"x": median, "noise": 0.0}]
    for model_dir, missing_answer in ((boosted.model_dir, 20.0), (forest.model_dir, None)):
        loaded = LoadedModel.load(model_dir)
        frame, problems = loaded.check_body({"instances": rows})
        assert problems == []
        predicted = loaded.predict_frame(frame)
        if missing_answer is None:  # imputed: the missing row is the median row
            assert predicted[0] == predicted[1]
        else:
            assert predicted[0] == pytest.approx(missing_answer, abs=1.0) and abs(predicted[1] - median) < 1.0
