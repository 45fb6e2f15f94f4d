"""The data stage: validation, the deterministic split, the JSON preprocessor, and Ray Data runs.

Pure logic is tested in-process. The integration tests run every stage call in one driver process
connected to the session's real Ray cluster (one Ray start-up for all of them), then check each
outcome here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from airflow_ray_ml_stages import wine
from airflow_ray_ml_stages.data.split import SPLITS, assign_splits
from airflow_ray_ml_stages.errors import DataSourceError, SpecError
from airflow_ray_ml_stages.preprocessor import Moments, Preprocessor, feature_affine, inverse_transform
from airflow_ray_ml_stages.specs import PreprocessSpec
from tests.child import run_python
from tests.conftest import ROOT

SEED = 5
FRACTIONS = [0.7, 0.15, 0.15]
HASHED = sorted([*wine.FEATURES, wine.TYPE_COLUMN, wine.LABEL])


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return wine.generate(rows=600, seed=11)


def _train_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[assign_splits(frame, HASHED, FRACTIONS, SEED) == 0]


def _pieces(table: pd.DataFrame, count: int) -> list[pd.DataFrame]:
    bounds = np.linspace(0, len(table), count + 1).astype(int)
    return [table.iloc[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


# -- pure logic ----------------------------------------------------------------------------------

def test_split_assignment_same_rows_whatever_the_batching(frame):
    whole = assign_splits(frame, HASHED, FRACTIONS, SEED)
    shuffled = frame.sample(frac=1.0, random_state=1)
    pieces = np.concatenate([assign_splits(part, HASHED, FRACTIONS, SEED) for part in _pieces(shuffled, 7)])
    assert (pd.Series(pieces, index=shuffled.index).sort_index().to_numpy() == whole).all()
    counts = np.bincount(whole, minlength=3) / len(frame)
    assert np.allclose(counts, FRACTIONS, atol=0.06)


def _copies_table(copies: int = 300) -> pd.DataFrame:
    """A table of few discrete values, as a survey's: each of its 8 profiles (kind, level) repeated
    ``copies`` times, a third of each profile's rows labelled 1, the rest 0 (one file order)."""
    rows = []
    for kind in ("a", "b"):
        for level in range(4):
            rows += [{"kind": kind, "level": level, "label": int(copy % 3 == 0)} for copy in range(copies)]
    return pd.DataFrame(rows)


def test_split_assignment_places_each_copy_of_a_row_by_itself():
    """Copies of a row (the same profile and label) spread over the splits as distinct rows do;
    grouped, a profile would train with one label and be tested with the other."""
    table = _copies_table()
    splits = assign_splits(table, ["kind", "label", "level"], FRACTIONS, SEED)
    for _, group in table.assign(split=splits).groupby(["kind", "level", "label"]):
        shares = np.bincount(group["split"], minlength=3) / len(group)
        assert np.allclose(shares, FRACTIONS, atol=0.1), shares


def test_split_assignment_first_copy_keeps_the_rows_split_and_appended_copies_move_no_row(frame):
    """A row's first occurrence splits as a table without copies does; copies appended later leave
    every earlier row where it was."""
    whole = assign_splits(frame, HASHED, FRACTIONS, SEED)
    grown = pd.concat([frame, frame.head(50), frame.head(50)], ignore_index=True)
    assert (assign_splits(grown, HASHED, FRACTIONS, SEED)[:len(frame)] == whole).all()


def test_direct_engine_batches_are_the_files_runs_of_batch_rows_rows(tmp_path):
    """The direct engine's batches, CSV and Parquet, are rows [0, n), [n, 2n), ... of a file, as Ray Data's
    map_batches gives a file read as one block: copies are numbered within the same rows by both engines."""
    from airflow_ray_ml_stages.data.engines import iter_source_tables
    from airflow_ray_ml_stages.data.schema import ColumnPlan
    from airflow_ray_ml_stages.data.sources import SourceLayout

    table = pd.DataFrame({"x": np.arange(2500, dtype="float64"), "y": np.arange(2500) % 7})
    table.to_csv(tmp_path / "rows.csv", index=False)
    table.to_parquet(tmp_path / "rows.parquet", row_group_size=333)
    plan = ColumnPlan(["x"], [], "y")
    for name, file_format in (("rows.csv", "csv"), ("rows.parquet", "parquet")):
        layout = SourceLayout(uri=str(tmp_path / name), path=str(tmp_path / name), file_format=file_format,
                              delimiter=",", columns=["x", "y"], size=(tmp_path / name).stat().st_size)
        batches = [batch.column("x").to_numpy() for batch in iter_source_tables(layout, plan, batch_rows=1000)]
        assert [len(batch) for batch in batches] == [1000, 1000, 500], name
        np.testing.assert_array_equal(np.concatenate(batches), table["x"].to_numpy())


def test_row_hash_without_pandas_equals_pandas_hash_bit_for_bit():
    """Seed 0 is pandas' hash exactly; another seed, pandas' hash under that seed's key, reseeded."""
    from airflow_ray_ml_stages.data.split import hash_columns, hash_key, reseed

    texts = ["", "red", "white", "rosé", "x" * 7, "y" * 8, "z" * 9, "日本語", "a" * 100]
    texts += [f"value-{index}-{'q' * (index % 23)}" for index in range(60)]
    codes = np.array([*range(len(texts)), -1, 3, 0], dtype="int32")
    floats = np.resize(np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, 1e300, -2.25]), len(codes))
    # pandas 3 hashes -0.0 as 0.0 and every NaN alike, pandas 2 does not: the split hash is pandas 3's
    # whichever pandas is installed, so pandas is given the values it would canonicalise itself.
    canonical = np.where(np.isnan(floats), np.nan, floats + 0.0)
    for seed in (0, 5, 123):
        expected = pd.util.hash_pandas_object(
            pd.DataFrame({"a": canonical, "b": pd.Categorical.from_codes(codes, categories=pd.Index(texts, dtype=object))}),
            index=False, hash_key=hash_key(seed)).to_numpy()
        np.testing.assert_array_equal(hash_columns([floats, (codes, texts)], seed), reseed(expected.copy(), seed))
    np.testing.assert_array_equal(hash_columns([floats], 0), pd.util.hash_pandas_object(
        pd.DataFrame({"a": canonical}), index=False).to_numpy())


def test_data_stage_module_imports_without_pandas():
    code = "import sys, airflow_ray_ml_stages.data.stage; assert 'pandas' not in sys.modules, 'airflow_ray_ml_stages.data.stage imported pandas'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])})
    assert done.returncode == 0, done.stderr[-2000:]


FRESH_RUN = """
import json, sys
from airflow_ray_ml_stages.data.stage import run_preprocess
from airflow_ray_ml_stages.specs import PreprocessSpec
outcomes = {}
for name, fields in json.loads(sys.argv[1]).items():
    try:
        run_preprocess(PreprocessSpec(**fields))
        outcomes[name] = "ok"
    except Exception as err:
        outcomes[name] = f"{type(err).__name__}: {err}"
    outcomes[name + " imported"] = sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules)
report(outcomes)
"""


def test_direct_engine_in_a_fresh_process_needs_neither_pandas_nor_pyarrow_compute(frame, tmp_path):
    """The job's driver skips both imports (~0.2 s of a small stage) and still gets pandas when a
    slow path needs it: here a Parquet file whose numeric column holds text."""
    frame.to_csv(tmp_path / "wine.csv", index=False)
    text = frame.head(40).astype({"alcohol": str})
    text.loc[7, "alcohol"] = "twelve"
    text.to_parquet(tmp_path / "text.parquet", index=False)
    specs = {"csv": {"source": [str(tmp_path / "wine.csv")], "artifact_dir": str(tmp_path / "out-csv"), "seed": SEED,
                     "label_column": wine.LABEL},
             "text": {"source": [str(tmp_path / "text.parquet")], "artifact_dir": str(tmp_path / "out-text"),
                      "label_column": wine.LABEL,
                      "categorical_columns": [wine.TYPE_COLUMN]}}  # else a text column is categorical
    outcomes = run_python(FRESH_RUN, json.dumps(specs),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}).result
    assert outcomes["csv"] == "ok" and outcomes["csv imported"] == []
    assert "'alcohol' must be numeric" in outcomes["text"] and "twelve" in outcomes["text"]
    assert "pandas" in outcomes["text imported"]
    from airflow_ray_ml_stages.data.stage import run_preprocess

    here = run_preprocess(PreprocessSpec(**{**specs["csv"], "artifact_dir": str(tmp_path / "here")}))
    for split in ("train", "validation", "test"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out-csv" / "splits" / f"split={split}"),
                                      pd.read_parquet(here.split_uris[split]))


def test_dictionary_codes_unify_chunks_with_their_own_dictionaries():
    import pyarrow as pa

    from airflow_ray_ml_stages.data.batch import dictionary_codes

    first = pa.DictionaryArray.from_arrays(pa.array([1, 0, None, 1], pa.int32()), pa.array(["red", "white"]))
    second = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["white", "rosé"]))
    codes, values = dictionary_codes(pa.chunked_array([first, second]))
    decoded = [values[code] if code >= 0 else None for code in codes]
    assert decoded == ["white", "red", None, "white", "white", "rosé", "rosé"]
    assert codes.dtype == np.int32 and sorted(values) == ["red", "rosé", "white"]


def test_take_rows_equals_fancy_indexing_in_column_major_order():
    from airflow_ray_ml_stages.data.profile import take_rows

    numeric = np.asfortranarray(np.random.default_rng(3).normal(size=(500, 6)))
    mask = np.random.default_rng(4).random(500) < 0.3
    for rows in (mask, np.flatnonzero(mask)):
        taken = take_rows(numeric, rows)
        np.testing.assert_array_equal(taken, numeric[mask])
        assert taken.flags.f_contiguous


def test_split_assignment_other_seed_moves_rows(frame):
    assert (assign_splits(frame, HASHED, FRACTIONS, SEED) != assign_splits(frame, HASHED, FRACTIONS, SEED + 1)).any()


def test_split_assignment_numeric_only_table_moves_with_the_seed_and_seed_0_is_pandas_hash(frame):
    """The seed keys only the hash of text values: a numeric-only table must still split per seed."""
    from airflow_ray_ml_stages.data.split import split_of_hashes

    numeric = sorted([*wine.FEATURES, wine.LABEL])
    by_seed = {seed: assign_splits(frame, numeric, FRACTIONS, seed) for seed in (0, 1, 2)}
    assert (by_seed[0] != by_seed[1]).mean() > 0.2 and (by_seed[1] != by_seed[2]).mean() > 0.2
    for split in by_seed.values():
        assert np.allclose(np.bincount(split, minlength=3) / len(frame), FRACTIONS, atol=0.06)
    pandas_hash = pd.util.hash_pandas_object(frame[numeric].astype("float64"), index=False).to_numpy()
    np.testing.assert_array_equal(by_seed[0], split_of_hashes(pandas_hash, FRACTIONS))


def test_moments_merged_from_pieces_equal_numpy_on_the_whole():
    values = np.random.default_rng(0).normal(50, 9, size=(1000, 3))
    merged = Moments.empty(3)
    for part in np.array_split(values, 9):
        merged = merged.merge(Moments.of(part))
    assert merged.count == 1000
    np.testing.assert_allclose(merged.mean, values.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.std, values.std(axis=0, ddof=0), rtol=1e-12)
    np.testing.assert_array_equal(merged.minimum, values.min(axis=0))


@pytest.mark.parametrize("scaler", ["standard", "minmax", "none"])
def test_preprocessor_json_round_trip_transforms_a_batch_identically(frame, scaler):
    columns = list(wine.FEATURES)
    fitted = Preprocessor.fit(scaler, columns, Moments.of(frame[columns].to_numpy()), {"type": ["red", "white"]},
                              "quality")
    loaded = Preprocessor.from_json(fitted.to_json())
    assert loaded == fitted
    batch = frame.sample(20, random_state=3)
    pd.testing.assert_frame_equal(loaded.transform(batch), fitted.transform(batch))
    out = loaded.transform(frame)
    assert list(out.columns) == [*columns, "type=red", "type=white"]
    assert (out["type=red"] == (frame["type"] == "red")).all()
    if scaler == "standard":
        np.testing.assert_allclose(out[columns].mean(), 0, atol=1e-9)
        np.testing.assert_allclose(out[columns].std(ddof=0), 1, atol=1e-9)
    elif scaler == "minmax":
        assert out[columns].min().min() == 0 and out[columns].max().max() == 1


def test_preprocessor_json_keeps_the_order_of_categorical_columns_not_in_alphabetical_order():
    # The model's inputs are the output columns in the data stage's order; the file's sorted keys must not
    # reorder them (a table whose categorical columns are not alphabetical, with '=' inside categories).
    categories = {"marital": ["1. Never", "2. Married"], "health": ["1. <=Good", "2. >=Very Good"], "age_band": ["a"]}
    fitted = Preprocessor.fit("standard", ["x"], Moments.of(np.array([[1.0], [3.0]])), categories, "wage")
    loaded = Preprocessor.from_json(fitted.to_json())
    assert loaded.output_columns == fitted.output_columns == [
        "x", "marital=1. Never", "marital=2. Married", "health=1. <=Good", "health=2. >=Very Good", "age_band=a"]
    batch = pd.DataFrame({"x": [1.0, 3.0], "marital": ["2. Married", "1. Never"], "health": ["1. <=Good", "?"],
                          "age_band": ["a", "a"]})
    pd.testing.assert_frame_equal(loaded.transform(batch), fitted.transform(batch))
    assert loaded.transform(batch)["health=1. <=Good"].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("scaler", ["standard", "minmax"])
def test_inverse_transform_gives_back_the_numbers_as_written_without_round_off(scaler):
    from airflow_ray_ml_stages.preprocessor import inverse_transform

    raw = pd.DataFrame({"x": [1512.0, 0.28, 3.2e-5, -7.125, 0.0, 123456.789], "colour": ["red"] * 6})
    fitted = Preprocessor.fit(scaler, ["x"], Moments.of(raw[["x"]].to_numpy() * 1.37 + 0.11), {"colour": ["red"]}, "y")
    back = inverse_transform(fitted, fitted.transform(raw))
    assert back["x"].tolist() == raw["x"].tolist()  # exactly: 1512.0, not 1511.9999999999998
    assert back["colour"].tolist() == raw["colour"].tolist()


def test_preprocessor_unseen_category_and_constant_column_are_safe():
    batch = pd.DataFrame({"x": [2.0, 2.0], "colour": ["red", "rosé"]})
    fitted = Preprocessor.fit("standard", ["x"], Moments.of(np.array([[2.0], [2.0]])), {"colour": ["red"]}, "y")
    out = fitted.transform(batch)
    assert out["x"].tolist() == [0.0, 0.0] and out["colour=red"].tolist() == [1.0, 0.0]


def test_preprocessor_json_with_wrong_format_is_refused():
    with pytest.raises(SpecError, match="not a preprocessor"):
        Preprocessor.from_json('{"format": "pickle"}')


@pytest.mark.parametrize(
    ("fields", "quoted"),
    [
        ({"source": []}, "source must be a list of non-empty strings with at least one item, got []"),
        ({"split": [0.5, 0.5]}, "got [0.5, 0.5]"),
        ({"split": [0.0, 0.5, 0.5]}, "got [0.0, 0.5, 0.5]"),
        ({"scaler": "robust"}, "got 'robust'"),
        ({"nan_policy": "ignore"}, "got 'ignore'"),
        ({"label_range": [10, 0]}, "got [10, 0]"),
        ({"feature_columns": ["quality"]}, "must not contain the label column 'quality'"),
        ({"delimiter": "|"}, "got '|'"),
        ({"engine": "spark"}, "engine must be one of ['auto', 'direct', 'ray_data'], got 'spark'"),
        ({"direct_max_bytes": -1}, "direct_max_bytes must be an integer >= 0, got -1"),
    ],
)
def test_preprocess_spec_bad_value_is_quoted(fields, quoted):
    with pytest.raises(SpecError) as raised:
        PreprocessSpec(**{"artifact_dir": "/tmp/a", "source": ["/x.csv"], "label_column": wine.LABEL, **fields})
    assert quoted in str(raised.value)


def test_preprocess_spec_round_trips_and_takes_one_source_string():
    spec = PreprocessSpec(artifact_dir="/tmp/a", source="/x.csv", label_column=wine.LABEL, label_range=[3, 9],
                          scaler="minmax")
    assert spec.source == ["/x.csv"]
    assert PreprocessSpec.from_json(spec.to_json()) == spec


# -- against the real Ray cluster ----------------------------------------------------------------

RUNNER = """
import json, sys, traceback
import ray, airflow_ray_ml_stages, os
ray.init(runtime_env={"py_modules": [os.path.dirname(airflow_ray_ml_stages.__file__)]}, logging_level="WARNING",
         log_to_driver=False)
from airflow_ray_ml_stages.data.stage import run_preprocess
from airflow_ray_ml_stages.specs import PreprocessSpec
outcomes = {}
for name, fields in json.load(open(sys.argv[1])).items():
    try:
        outcomes[name] = {"result": run_preprocess(PreprocessSpec(**fields)).to_dict()}
    except Exception as err:
        outcomes[name] = {"error": f"{type(err).__name__}: {err}"}
json.dump(outcomes, open(sys.argv[2], "w"))
"""


def _write_inputs(folder, frame: pd.DataFrame) -> dict[str, list[str]]:
    """The same rows as UCI files, one comma CSV, five comma CSV shards and Parquet; and bad files."""
    paths: dict[str, list[str]] = {}
    paths["uci"] = []
    for colour in ("red", "white"):
        path = folder / f"winequality-{colour}.csv"
        path.write_bytes(wine.to_uci_csv(frame[frame[wine.TYPE_COLUMN] == colour]))
        paths["uci"].append(str(path))
    frame.to_csv(folder / "wine.csv", index=False)
    paths["csv"] = [str(folder / "wine.csv")]
    shuffled = frame.sample(frac=1.0, random_state=2)
    paths["shards"] = []
    for index, part in enumerate(_pieces(shuffled, 5)):
        part.to_csv(folder / f"shard-{index}.csv", index=False)
        paths["shards"].append(str(folder / f"shard-{index}.csv"))
    frame.to_parquet(folder / "wine.parquet", index=False)
    paths["parquet"] = [str(folder / "wine.parquet")]

    def bad(name: str, table: pd.DataFrame | None = None, text: str | None = None) -> None:
        path = folder / name
        if text is not None:
            path.write_text(text)
        else:
            table.to_csv(path, index=False)
        paths[name] = [str(path)]

    small = frame.head(40).copy()
    text_values = small.astype({"alcohol": object})
    text_values.loc[7, "alcohol"] = "twelve"
    bad("non_numeric.csv", text_values)
    with_nan = small.copy()
    with_nan.loc[[3, 9], "pH"] = np.nan
    bad("nan.csv", with_nan)
    with_inf = small.copy()
    with_inf.loc[5, "density"] = np.inf
    bad("inf.csv", with_inf)
    out_of_range = small.copy()
    out_of_range.loc[11, "quality"] = 42
    bad("label_range.csv", out_of_range)
    bad("empty.csv", text="")
    bad("header_only.csv", text=",".join(small.columns) + "\n")
    bad("wrong_delimiter.csv", text=wine.to_uci_csv(small[small[wine.TYPE_COLUMN] == "red"]).decode())
    bad("duplicate.csv", text=small.to_csv(index=False).replace("chlorides", "pH", 1))
    bad("missing.csv", small.drop(columns=["sulphates"]))
    bad("unexpected.csv", small.assign(vintage=2020))
    return paths


VALIDATION_CASES = {
    # name: (file, extra spec fields, what the error must say, its sample)
    "non_numeric": ("non_numeric.csv", {}, "'alcohol' must be numeric", "twelve"),
    "nan": ("nan.csv", {"nan_policy": "fail"}, "'pH' has 2 NaN, infinite or missing", "nan_policy='impute'"),
    "inf": ("inf.csv", {"nan_policy": "fail"}, "'density' has 1 NaN, infinite or missing", '"density": "inf"'),
    "label_range": ("label_range.csv", {"label_range": [0, 10]}, "outside label_range [0, 10]", '"quality": 42'),
    "empty": ("empty.csv", {}, "is empty", None),
    "header_only": ("header_only.csv", {}, "but no data rows", None),
    "wrong_delimiter": ("wrong_delimiter.csv", {"delimiter": ","}, "looks semicolon-separated", "delimiter=';'"),
    "duplicate": ("duplicate.csv", {}, "duplicate column name(s) ['pH']", None),
    "missing": ("missing.csv", {"feature_columns": list(wine.FEATURES) + ["type"]}, "lacks feature column(s) ['sulphates']", None),
    "unexpected": ("unexpected.csv", {"feature_columns": list(wine.FEATURES) + ["type"]}, "unexpected column(s) ['vintage']", None),
}


@pytest.fixture(scope="module")
def runs(ray_cluster, frame, tmp_path_factory):
    """Run every stage call of this module in one driver connected to the test cluster."""
    folder = tmp_path_factory.mktemp("data_stage")
    inputs = _write_inputs(folder, frame)
    frame.assign(strong=np.where(frame["alcohol"] > 10.5, "True", "False"),
                 sweet=np.where(frame["residual sugar"] > 5, "yes", "NO")).to_csv(folder / "booleans.csv", index=False)
    common = {"seed": SEED, "split": FRACTIONS, "label_range": [0, 10]}
    specs = {
        "uci": {"source": inputs["uci"], **common},
        "csv_one_block": {"source": inputs["csv"], "override_num_blocks": 1, "engine": "ray_data", **common},
        "csv_shards_many_blocks": {"source": inputs["shards"], "override_num_blocks": 8, "engine": "ray_data", **common},
        "csv_direct": {"source": inputs["csv"], **common},
        "shards_direct": {"source": inputs["shards"], **common},
        "uci_ray_data": {"source": inputs["uci"], "engine": "ray_data", **common},
        "auto_over_size_one_node": {"source": inputs["csv"], "direct_max_bytes": 0, **common},
        "parquet": {"source": inputs["parquet"], **common},
        "nan_dropped": {"source": inputs["nan.csv"], "nan_policy": "drop", "seed": SEED},
        "minmax": {"source": inputs["csv"], "scaler": "minmax", "seed": SEED},
        "booleans_direct": {"source": [str(folder / "booleans.csv")], **common},
        "booleans_ray_data": {"source": [str(folder / "booleans.csv")], "engine": "ray_data", **common},
    }
    _copies_table().to_csv(folder / "copies.csv", index=False)
    copies = {"source": [str(folder / "copies.csv")], "label_column": "label", "seed": SEED, "split": FRACTIONS}
    specs.update({"copies_direct": copies, "copies_ray_data": {**copies, "engine": "ray_data"},
                  "copies_classes": {**copies, "task": "classification"},
                  "copies_classes_ray_data": {**copies, "task": "classification", "engine": "ray_data"}})
    for name, (file, fields, _, _) in VALIDATION_CASES.items():
        specs[f"invalid_{name}"] = {"source": inputs[file], "seed": SEED, **fields}
        specs[f"invalid_{name}_ray_data"] = {"source": inputs[file], "seed": SEED, "engine": "ray_data", **fields}
    for name, fields in specs.items():
        fields["artifact_dir"] = str(folder / "out" / name)
        fields.setdefault("label_column", wine.LABEL)
    outcomes = run_in_ray_driver(ray_cluster, specs, folder)
    return {name: {**outcome, "artifact_dir": specs[name]["artifact_dir"]} for name, outcome in outcomes.items()}


def run_in_ray_driver(ray_cluster, specs: dict[str, dict], folder) -> dict[str, dict]:
    """Each named spec run by the data stage in one Ray driver on ``ray_cluster`` (as a job runs it):
    its result, or its error as text."""
    (folder / "specs.json").write_text(json.dumps(specs))
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address, "RAY_AUTH_TOKEN": ray_cluster.token,
           "RAY_AUTH_MODE": "token", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
    done = subprocess.run([sys.executable, "-c", RUNNER, str(folder / "specs.json"), str(folder / "outcomes.json")],
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((folder / "outcomes.json").read_text())


def _result(runs, name: str) -> dict:
    assert "error" not in runs[name], runs[name]["error"]
    return runs[name]["result"]


def _split(result: dict, name: str) -> pd.DataFrame:
    """A written split as a sorted table of rounded values, comparable across runs."""
    table = pd.read_parquet(result["split_uris"][name])
    table = table[[*result["feature_columns"], result["label_column"]]].round(9)
    return table.sort_values(list(table.columns)).reset_index(drop=True)


@pytest.mark.integration
def test_data_stage_same_input_and_seed_same_splits_whatever_blocks_and_files(runs):
    one_block, many = _result(runs, "csv_one_block"), _result(runs, "csv_shards_many_blocks")
    assert one_block["rows"] == many["rows"] and sum(one_block["rows"].values()) == 600
    for name in ("train", "validation", "test"):
        pd.testing.assert_frame_equal(_split(one_block, name), _split(many, name))


@pytest.mark.integration
def test_data_stage_direct_and_ray_data_engines_write_the_same_splits_and_statistics(runs):
    pairs = [("csv_direct", "csv_one_block"), ("shards_direct", "csv_shards_many_blocks"), ("uci", "uci_ray_data")]
    for direct_name, ray_name in pairs:
        direct, ray_data = _result(runs, direct_name), _result(runs, ray_name)
        assert direct["rows"] == ray_data["rows"] and direct["fingerprint"] == ray_data["fingerprint"]
        assert json.load(open(direct["profile_uri"]))["engine"]["name"] == "direct"
        assert json.load(open(ray_data["profile_uri"]))["engine"]["name"] == "ray_data"
        fitted = Preprocessor.load(direct["preprocessor_uri"]), Preprocessor.load(ray_data["preprocessor_uri"])
        assert fitted[0].categories == fitted[1].categories
        for column, stats in fitted[0].statistics.items():
            assert fitted[1].statistics[column] == pytest.approx(stats, rel=1e-12)
        for name in ("train", "validation", "test"):
            pd.testing.assert_frame_equal(_split(direct, name), _split(ray_data, name))


@pytest.mark.integration
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_data_stage_spreads_the_copies_of_a_row_over_the_splits_in_both_engines(runs, task):
    """A table of 8 profiles x 300 rows, each profile a third labelled 1: every profile trains and
    is tested with both of its labels in the shares it has, and both engines write the same rows."""
    names = ("copies_direct", "copies_ray_data") if task == "regression" else ("copies_classes", "copies_classes_ray_data")
    direct, ray_data = (_result(runs, name) for name in names)
    assert json.load(open(ray_data["profile_uri"]))["engine"]["name"] == "ray_data"
    for name in SPLITS:
        pd.testing.assert_frame_equal(_split(direct, name), _split(ray_data, name))
    features = direct["feature_columns"]
    counts = {name: pd.read_parquet(direct["split_uris"][name]).groupby(features)["label"].agg(["size", "mean"])
              for name in SPLITS}
    assert len(counts["train"]) == len(counts["test"]) == 8  # every profile in every split
    for name in SPLITS:
        shares = counts[name]["size"] / counts[name]["size"].sum()
        assert np.allclose(shares, 1 / 8, atol=0.05), (name, shares)
        # each profile's rows labelled 1: a third, as in the table (grouped copies would give 0 or 1)
        assert counts[name]["mean"].between(0.1, 0.6).all(), (name, counts[name])
    assert sum(direct["rows"].values()) == 2400
    assert direct["rows"]["train"] == pytest.approx(0.7 * 2400, abs=120)


@pytest.mark.integration
def test_data_stage_ray_data_engine_writes_boolean_columns_as_the_direct_one_does(runs):
    direct, ray_data = _result(runs, "booleans_direct"), _result(runs, "booleans_ray_data")
    assert json.load(open(ray_data["profile_uri"]))["engine"]["name"] == "ray_data"
    for result in (direct, ray_data):
        assert Preprocessor.load(result["preprocessor_uri"]).boolean_columns == ["strong", "sweet"]
    for name in ("train", "validation", "test"):
        written = _split(ray_data, name)
        pd.testing.assert_frame_equal(_split(direct, name), written)
        assert set(written["strong"]) == set(written["sweet"]) == {0.0, 1.0}


@pytest.mark.integration
def test_data_stage_auto_engine_over_the_size_threshold_on_one_node_stays_direct(runs):
    result = _result(runs, "auto_over_size_one_node")
    engine = json.load(open(result["profile_uri"]))["engine"]
    assert engine["name"] == "direct" and "the cluster has one node" in engine["reason"], engine
    assert result["rows"] == _result(runs, "csv_one_block")["rows"]


@pytest.mark.integration
def test_data_stage_uci_semicolon_comma_csv_and_parquet_give_the_same_result(runs):
    uci, csv, parquet = (_result(runs, name) for name in ("uci", "csv_one_block", "parquet"))
    assert uci["rows"] == csv["rows"] == parquet["rows"]
    fitted = [Preprocessor.load(result["preprocessor_uri"]) for result in (uci, csv, parquet)]
    assert fitted[0].categories == fitted[1].categories == fitted[2].categories == {"type": ["red", "white"]}
    for other in fitted[1:]:
        for column, stats in fitted[0].statistics.items():
            assert other.statistics[column] == pytest.approx(stats, rel=1e-12)
    for name in ("train", "validation", "test"):
        pd.testing.assert_frame_equal(_split(uci, name), _split(csv, name))
        pd.testing.assert_frame_equal(_split(parquet, name), _split(csv, name))


@pytest.mark.integration
def test_data_stage_scaler_statistics_equal_numpy_on_the_train_split(runs, frame):
    result = _result(runs, "csv_one_block")
    train = _train_rows(frame)
    assert result["rows"]["train"] == len(train)
    fitted = Preprocessor.load(result["preprocessor_uri"])
    for column in wine.FEATURES:
        values = train[column].to_numpy()
        assert fitted.statistics[column]["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert fitted.statistics[column]["std"] == pytest.approx(values.std(ddof=0), rel=1e-12)
    written = pd.read_parquet(result["split_uris"]["train"])
    np.testing.assert_allclose(written[list(wine.FEATURES)].mean(), 0, atol=1e-9)
    np.testing.assert_allclose(written[list(wine.FEATURES)].std(ddof=0), 1, atol=1e-9)
    minmax = Preprocessor.load(_result(runs, "minmax")["preprocessor_uri"])
    assert minmax.statistics["alcohol"] == {"min": train["alcohol"].min(), "max": train["alcohol"].max()}


@pytest.mark.integration
def test_data_stage_saved_preprocessor_transforms_raw_rows_like_the_written_split(runs, frame):
    result = _result(runs, "uci")
    loaded = Preprocessor.from_json(open(result["preprocessor_uri"]).read())
    train = _train_rows(frame)
    served = loaded.transform(train).assign(quality=train["quality"].to_numpy()).round(9)
    served = served.sort_values(list(served.columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(served, _split(result, "train"), check_dtype=False)


@pytest.mark.integration
def test_data_stage_profile_and_manifest_describe_the_outputs(runs, frame):
    result = _result(runs, "uci")
    profile = json.load(open(result["profile_uri"]))
    assert profile["rows"] == {"read": 600, "dropped": 0, **result["rows"]}
    assert profile["fingerprint"] == result["fingerprint"].strip() and result["fingerprint"].startswith("sha256:")
    assert profile["columns"]["alcohol"]["mean"] == pytest.approx(frame["alcohol"].mean(), rel=1e-12)
    distribution = profile["label"]["distribution"]
    assert sum(sum(counts.values()) for counts in distribution.values()) == 600
    assert profile["categories"]["type"]["train"]["red"] + profile["categories"]["type"]["train"]["white"] == result["rows"]["train"]
    assert json.load(open(os.path.join(result["profile_uri"].rsplit("/", 1)[0], "profile.json"))) == profile


@pytest.mark.integration
def test_data_stage_nan_policy_drop_counts_the_dropped_rows(runs):
    result = _result(runs, "nan_dropped")
    assert result["rows_dropped"] == 2 and result["rows_read"] == 40 and sum(result["rows"].values()) == 38


@pytest.mark.integration
@pytest.mark.parametrize("engine", ["direct", "ray_data"])
@pytest.mark.parametrize("case", sorted(VALIDATION_CASES))
def test_data_stage_invalid_input_names_file_column_and_rows_and_writes_nothing(runs, case, engine):
    file, _, message, sample = VALIDATION_CASES[case]
    outcome = runs[f"invalid_{case}" + ("_ray_data" if engine == "ray_data" else "")]
    assert "error" in outcome, f"{case} passed validation: {outcome}"
    error = outcome["error"]
    assert error.startswith("DataSourceError: ") and file in error and message in error, error
    if sample:
        assert sample in error, error
    assert not os.path.exists(outcome["artifact_dir"])


# -- the operator in a DAG -----------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.lowest
def test_preprocess_operator_in_dag_test_returns_manifest_as_xcom(airflow_db, ray_conn):
    from tests.operators.test_ray_job import _run, _xcom

    dag_run = _run("data_preprocess")
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "preprocess")
    generated = _xcom(dag_run, "demo_data")
    assert manifest["status"] == "succeeded" and manifest["stage"] == "data"
    assert manifest["rows_read"] == 800 and sum(manifest["rows"].values()) == 800
    assert manifest["fingerprint"] == generated["fingerprint"]
    assert "type=red" in manifest["feature_columns"]
    assert Preprocessor.load(manifest["preprocessor_uri"]).scaler == "standard"
    assert len(pd.read_parquet(manifest["split_uris"]["train"])) == manifest["rows"]["train"]
    # The Ray Data engine inside a real job (``python -m airflow_ray_ml_stages.data``): its tasks must unpickle on
    # the workers, and it writes what the direct engine writes.
    on_ray_data = _xcom(dag_run, "preprocess_ray_data")
    assert on_ray_data["status"] == "succeeded" and on_ray_data["rows"] == manifest["rows"]
    assert json.loads(open(on_ray_data["profile_uri"]).read())["engine"]["name"] == "ray_data"
    for split in ("train", "test"):
        direct, ray_data = (_split(result, split) for result in (manifest, on_ray_data))
        pd.testing.assert_frame_equal(direct, ray_data, check_dtype=False)


@pytest.mark.integration
def test_data_stage_writes_every_scaler_variant_that_maps_the_written_split_exactly(runs, frame):
    result = _result(runs, "uci")
    variants = {name: Preprocessor.load(uri) for name, uri in result["preprocessor_variants"].items()}
    assert sorted(variants) == ["minmax", "none", "standard"]
    assert variants["standard"].to_dict() == Preprocessor.load(result["preprocessor_uri"]).to_dict()
    train = _train_rows(frame)
    assert variants["minmax"].statistics["alcohol"] == {"min": train["alcohol"].min(), "max": train["alcohol"].max()}
    # The tuning trials' path: the written (standard) split mapped to minmax, no refit.
    written = _split(result, "train")
    multiply, add = feature_affine(variants["standard"], variants["minmax"], result["feature_columns"])
    mapped = written[result["feature_columns"]].to_numpy() * multiply + add
    expected = variants["minmax"].transform(train).assign(quality=train["quality"].to_numpy()).round(9)
    expected = expected.sort_values(list(written.columns)).reset_index(drop=True)
    np.testing.assert_allclose(np.sort(mapped, axis=0), np.sort(expected[result["feature_columns"]].to_numpy(), axis=0),
                               atol=1e-8)


# -- boolean columns ----------------------------------------------------------------------------

def _boolean_table(rows: int, seed: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    flag = rng.random(rows) < 0.4
    return pd.DataFrame({
        "x": rng.normal(size=rows).round(6),
        "flag": np.where(flag, "True", "False"),  # as pandas writes a bool column
        "member": rng.choice(["yes", "No", "YES", "no"], rows),
        "answer": rng.choice(["true", "maybe"], rows),  # not every value a boolean word: a category
        "zero_one": rng.integers(0, 2, rows),  # numbers: stays numeric
        "y": rng.normal(size=rows).round(6) + 3 * flag,
    })


def _preprocess_here(tmp_path, source: str, **fields):
    from airflow_ray_ml_stages.data.stage import run_preprocess

    return run_preprocess(PreprocessSpec(source=[source], label_column="y", artifact_dir=str(tmp_path / "out"),
                                         **fields))


def test_data_stage_boolean_columns_become_one_unscaled_zero_one_input_each(tmp_path):
    table = _boolean_table(400)
    table.to_csv(tmp_path / "table.csv", index=False)
    result = _preprocess_here(tmp_path, str(tmp_path / "table.csv"))
    preprocessor = Preprocessor.load(result.preprocessor_uri)
    assert preprocessor.input_types() == {"x": "number", "zero_one": "number", "flag": "boolean",
                                          "member": "boolean", "answer": "category"}
    assert result.feature_columns == ["x", "zero_one", "flag", "member", "answer=maybe", "answer=true"]
    written = pd.concat([pd.read_parquet(uri) for uri in result.split_uris.values()])
    assert len(written) == len(table) and set(written["flag"]) == set(written["member"]) == {0.0, 1.0}
    # Each written row's 1/0 is its own word (rows matched through x, distinct per row), and reads back as a bool.
    raw = inverse_transform(preprocessor, written).set_index("x")
    original = table.set_index("x")
    assert raw.index.is_unique and len(raw) == len(original)
    assert (raw["flag"] == (original.loc[raw.index, "flag"] == "True")).all()
    assert (raw["member"] == original.loc[raw.index, "member"].str.lower().eq("yes")).all()
    profile = json.loads(open(result.profile_uri).read())
    assert profile["boolean"] == ["flag", "member"]
    assert profile["columns"]["flag"]["mean"] == pytest.approx((table["flag"] == "True").mean())
    # The other scalers' variants leave the booleans as they are too.
    minmax = Preprocessor.load(result.preprocessor_variants["minmax"])
    assert minmax.boolean_columns == ["flag", "member"]
    assert minmax.transform(table.head(5))["flag"].tolist() == (table.head(5)["flag"] == "True").astype(float).tolist()


def test_data_stage_boolean_column_listed_as_categorical_stays_a_category(tmp_path):
    table = _boolean_table(200).drop(columns=["answer"])
    table.to_csv(tmp_path / "table.csv", index=False)
    result = _preprocess_here(tmp_path, str(tmp_path / "table.csv"), categorical_columns=["flag"])
    preprocessor = Preprocessor.load(result.preprocessor_uri)
    assert preprocessor.categories == {"flag": ["False", "True"]} and preprocessor.boolean_columns == ["member"]


def test_data_stage_parquet_booleans_and_boolean_words_are_boolean(tmp_path):
    table = _boolean_table(300).drop(columns=["answer"])
    table["flag"] = table["flag"] == "True"  # a Parquet boolean column
    table.to_parquet(tmp_path / "table.parquet", index=False)
    result = _preprocess_here(tmp_path, str(tmp_path / "table.parquet"))
    preprocessor = Preprocessor.load(result.preprocessor_uri)
    assert preprocessor.boolean_columns == ["flag", "member"]
    written = pd.read_parquet(result.split_uris["train"])
    assert written["flag"].sum() > 0 and set(written["member"]) == {0.0, 1.0}
    assert sum(result.rows.values()) == len(table)


def test_data_stage_boolean_column_with_another_value_after_its_first_rows_names_it_and_the_fix(tmp_path):
    table = _boolean_table(6000).drop(columns=["answer"])  # more rows than the head that decides the type
    table.loc[5500, "flag"] = "maybe"
    table.loc[5600, "flag"] = ""  # missing: nan_policy's business, not an error of its own
    table.to_csv(tmp_path / "table.csv", index=False)
    with pytest.raises(DataSourceError) as raised:
        _preprocess_here(tmp_path, str(tmp_path / "table.csv"))
    message = str(raised.value)
    assert "column 'flag' holds booleans" in message and "1 other value(s) such as ['maybe']" in message
    assert "categorical_columns" in message and "table.csv" in message
    table.loc[5500, "flag"] = "False"
    table.to_csv(tmp_path / "table.csv", index=False)
    result = _preprocess_here(tmp_path, str(tmp_path / "table.csv"), nan_policy="drop")
    assert result.rows_dropped == 1


def test_preprocessor_boolean_column_reads_words_json_booleans_and_zero_one_and_nothing_else():
    from airflow_ray_ml_stages.preprocessor import boolean_numbers

    fitted = Preprocessor.fit("standard", ["x"], Moments.of(np.array([[1.0], [3.0]])), {"colour": ["red"]}, "y",
                              boolean_columns=["flag"])
    assert fitted.input_columns == ["x", "flag", "colour"] and fitted.output_columns == ["x", "flag", "colour=red"]
    values = [True, False, "yes", " NO ", "True", "false", 1, 0.0, np.bool_(True), None, "maybe", 2, "1"]
    numbers, invalid = boolean_numbers(np.array(values, dtype=object))
    np.testing.assert_array_equal(numbers[:9], [1, 0, 1, 0, 1, 0, 1, 0, 1])
    assert np.isnan(numbers[9:]).all() and invalid.tolist() == [False] * 10 + [True] * 3
    batch = pd.DataFrame({"x": [1.0, 3.0, 2.0], "flag": [True, "no", False], "colour": ["red"] * 3})
    out = fitted.transform(batch)
    assert out["flag"].tolist() == [1.0, 0.0, 0.0] and out["x"].tolist() == [-1.0, 1.0, 0.0]
    loaded = Preprocessor.from_json(fitted.to_json())
    assert loaded == fitted
    back = inverse_transform(loaded, out)
    assert back["flag"].tolist() == [True, False, False] and all(type(v) is bool for v in back["flag"])


def test_preprocessor_saved_before_booleans_loads_and_encodes_its_true_false_category_as_before():
    # A preprocessor file written before boolean columns were told apart: Titanic's `alone` as a category.
    saved = {"format": "rayml.preprocessor/1", "scaler": "none", "numeric_columns": ["age"],
             "categories": {"alone": ["False", "True"]}, "statistics": {}, "label_column": "survived",
             "output_columns": ["age", "alone=False", "alone=True"], "task": "classification", "classes": [0, 1]}
    loaded = Preprocessor.from_json(json.dumps(saved))
    assert loaded.boolean_columns == [] and loaded.input_types() == {"age": "number", "alone": "category"}
    out = loaded.transform(pd.DataFrame({"age": [30.0, 4.0], "alone": ["True", "False"]}))
    assert out.columns.tolist() == saved["output_columns"] and out["alone=True"].tolist() == [1.0, 0.0]
    assert json.loads(loaded.to_json()) == saved  # written back unchanged
# -- what a data error quotes ---------------------------------------------------------------------

LONG = "aws_secret_access_key=" + "K" * 400  # a value far longer than an error may quote


def _long_value_files(folder, frame: pd.DataFrame) -> dict[str, tuple[str, dict]]:
    """{case: (file, extra spec fields)}: each file puts LONG where the data stage quotes the data."""
    small = frame.head(40).copy()
    text = small.astype({"alcohol": str})
    text.loc[7, "alcohol"] = LONG
    text.to_csv(folder / "text.csv", index=False)  # the typed read fails: the CSV is diagnosed
    text.to_parquet(folder / "text.parquet", index=False)  # read as text: the batch's finding
    (folder / "header.csv").write_text(f"{LONG},quality\n")
    (folder / "rows.csv").write_text(wine.to_uci_csv(small.head(5)).decode().replace("\n", f";{LONG}\n", 2))
    classes = small.assign(quality=[f"{LONG}-{index}" for index in range(len(small))])
    classes.to_csv(folder / "classes.csv", index=False)
    return {
        "non-numeric csv": ("text.csv", {}),
        "non-numeric parquet": ("text.parquet", {"categorical_columns": [wine.TYPE_COLUMN]}),
        "header without rows": ("header.csv", {}),
        "wrong delimiter": ("rows.csv", {"delimiter": ","}),
        "too many classes": ("classes.csv", {"task": "classification", "max_categories": 5}),
    }


@pytest.mark.parametrize("case", ["non-numeric csv", "non-numeric parquet", "header without rows", "wrong delimiter",
                                  "too many classes"])
def test_data_stage_error_cuts_each_quoted_value_to_quote_chars(frame, tmp_path, case):
    from airflow_ray_ml_stages.data.stage import run_preprocess
    from airflow_ray_ml_stages.errors import QUOTE_CHARS, DataSourceError

    file, fields = _long_value_files(tmp_path, frame)[case]
    spec = PreprocessSpec(source=[str(tmp_path / file)], artifact_dir=str(tmp_path / "out"), label_column=wine.LABEL,
                          **fields)
    with pytest.raises(DataSourceError) as caught:
        run_preprocess(spec)
    message = str(caught.value)
    assert case == "too many classes" or str(tmp_path / file) in message  # named in full: only the data is cut
    assert "..." in message and LONG[:QUOTE_CHARS] not in message and len(message) < 1200, message


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_data_stage_empty_text_in_a_categorical_column_is_missing_never_a_category(tmp_path, file_format):
    """An empty (or NA) text value is a missing value: nan_policy='fail' names its column, 'drop' drops and counts
    its rows, and no one-hot column of the empty text (``sex=``) is written."""
    rng = np.random.default_rng(2)
    table = pd.DataFrame({"x": rng.normal(size=300), "sex": rng.choice(["f", "m"], size=300), "y": rng.normal(size=300)})
    table.loc[[3, 50], "sex"] = ""
    table.loc[80, "sex"] = "NA"
    path = tmp_path / f"table.{file_format}"
    table.to_csv(path, index=False) if file_format == "csv" else table.to_parquet(path, index=False)
    with pytest.raises(DataSourceError, match=r"column 'sex' has 3 NaN, infinite or missing value\(s\)"):
        _preprocess_here(tmp_path, str(path), nan_policy="fail")
    result = _preprocess_here(tmp_path, str(path), nan_policy="drop")
    assert result.rows_dropped == 3 and sum(result.rows.values()) == 297
    assert result.feature_columns == ["x", "sex=f", "sex=m"]
    assert json.loads(open(result.profile_uri).read())["dropped_by_column"] == {"sex": 3}
