"""Specs round-trip through JSON and reject bad values with messages that quote them."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.specs import (
    ComputeSpec, GenerateResult, GenerateSpec, PreprocessResult, PreprocessSpec, ProbeSpec, ScoreSpec, TrainSpec,
    TuneSpec, preprocessed_fields,
)


def test_spec_json_round_trip_keeps_every_field():
    spec = GenerateSpec(artifact_dir="/tmp/a", rows=1000, seed=3, file_format="parquet")
    assert GenerateSpec.from_json(spec.to_json()) == spec
    assert GenerateSpec.from_dict(spec.to_dict()) == spec


def test_result_round_trip():
    result = GenerateResult(data_uris=["/a.csv"], rows=2, rows_by_type={"red": 1, "white": 1}, fingerprint="x")
    assert GenerateResult.from_json(result.to_json()) == result


@pytest.mark.parametrize(
    ("fields", "quoted"),
    [
        ({"rows": 1}, "rows must be an integer >= 2, got 1"),
        ({"rows": "100"}, "got '100'"),
        ({"rows": True}, "got True"),
        ({"file_format": "xlsx"}, "got 'xlsx'"),
        ({"artifact_dir": ""}, "artifact_dir must be a non-empty string, got ''"),
    ],
)
def test_spec_bad_value_is_quoted(fields, quoted):
    with pytest.raises(SpecError) as caught:
        GenerateSpec.from_dict({"artifact_dir": "/tmp/a", **fields})
    assert quoted in str(caught.value)


def test_spec_unknown_field_lists_known_ones():
    with pytest.raises(SpecError, match=r"unknown field\(s\) \['row'\].*'rows'"):
        GenerateSpec.from_dict({"artifact_dir": "/tmp/a", "row": 5})


def test_spec_missing_field_named():
    with pytest.raises(SpecError, match="artifact_dir"):
        GenerateSpec.from_dict({"rows": 5})


def test_spec_not_json_says_so():
    with pytest.raises(SpecError, match="not valid JSON"):
        GenerateSpec.from_json("{rows: 5")


def test_generate_spec_rejects_a_path_as_file_name():
    from airflow_ray_ml_stages.errors import SpecError
    from airflow_ray_ml_stages.specs import GenerateSpec

    assert GenerateSpec(artifact_dir="/tmp/x", name="new_wines", with_label=False).name == "new_wines"
    with pytest.raises(SpecError, match="GenerateSpec.name must be a plain file name"):
        GenerateSpec(artifact_dir="/tmp/x", name="../elsewhere")
    with pytest.raises(SpecError, match="with_label must be true or false"):
        GenerateSpec(artifact_dir="/tmp/x", with_label="no")


@pytest.mark.parametrize(("spec_type", "fields"), [
    (PreprocessSpec, {"source": ["/x.csv"]}),
    (TuneSpec, {"train_uri": "/d/t", "validation_uri": "/d/v", "feature_columns": ["a"], "preprocessor_uri": "/d/p"}),
    (TrainSpec, {"train_uri": "/d/t", "validation_uri": "/d/v", "test_uri": "/d/e", "feature_columns": ["a"]}),
])
@pytest.mark.parametrize("given", [{}, {"label_column": ""}, {"label_column": "  "}, {"label_column": None}])
def test_spec_without_label_column_says_it_is_required_and_what_it_is(spec_type, fields, given):
    with pytest.raises(SpecError) as caught:
        spec_type.from_dict({"artifact_dir": "/tmp/a", **fields, **given})
    got = repr(given.get("label_column", ""))
    assert str(caught.value) == (f"{spec_type.__name__}.label_column is required: the column to predict "
                                 f"(label_column='<column>'); got {got}")
    assert spec_type.from_dict({"artifact_dir": "/tmp/a", **fields, "label_column": "price"}).label_column == "price"


_TRAIN_DATA = {"train_uri": "/d/t", "validation_uri": "/d/v", "test_uri": "/d/e", "feature_columns": ["a"],
               "label_column": "y"}
_TUNE_DATA = {"train_uri": "/d/t", "validation_uri": "/d/v", "feature_columns": ["a"], "label_column": "y",
              "preprocessor_uri": "/d/p"}
_SPECS = {  # each spec with the least it needs to be valid
    "ComputeSpec": (ComputeSpec, ComputeSpec.cpu("test").to_dict()),
    "ProbeSpec": (ProbeSpec, {"artifact_dir": "/tmp/a"}),
    "ScoreSpec": (ScoreSpec, {"artifact_dir": "/tmp/a", "input_uri": "/d/in.csv", "model_dir": "/d/model"}),
    "TrainSpec": (TrainSpec, {"artifact_dir": "/tmp/a", **_TRAIN_DATA}),
    "TuneSpec": (TuneSpec, {"artifact_dir": "/tmp/a", **_TUNE_DATA}),
}
# Every field checked as a positive number: (spec, field, what it must be, a valid value at its lower edge).
POSITIVE_FIELDS = [
    ("ComputeSpec", "cpus_per_worker", "a number > 0", 0.25),
    ("ComputeSpec", "gpus_per_worker", "a number >= 0", 0),
    ("ProbeSpec", "wait_for_gpu_s", "a number of seconds >= 0", 0),
    ("ProbeSpec", "smoke_timeout_s", "a number of seconds >= 0", 0),
    ("ScoreSpec", "cpus_per_actor", "a number > 0", 0.1),
    ("TrainSpec", "gpu_placement_timeout_s", "a number of seconds >= 0", 0),
    ("TrainSpec", "resource_wait_s", "a number of seconds > 0", 0.5),
    ("TuneSpec", "cpus_per_trial", "a number > 0 or null", None),
    ("TuneSpec", "time_budget_s", "a number of seconds > 0 or null", None),
    ("TuneSpec", "resource_wait_s", "a number of seconds > 0", 0.5),
]


@pytest.mark.parametrize(("owner", "name", "what", "edge"), POSITIVE_FIELDS)
@pytest.mark.parametrize(("bad", "fix"), [
    (True, "; true/false is not a number: give the number itself"),
    (False, "; true/false is not a number: give the number itself"),
    ("2", "; give the number itself, not text"),
    (float("nan"), "; give a finite number"),
    (float("inf"), "; give a finite number"),
    (-1, ""),
])
def test_positive_field_bad_value_is_refused_quoting_field_value_and_fix(owner, name, what, edge, bad, fix):
    spec_type, valid = _SPECS[owner]
    with pytest.raises(SpecError) as caught:
        spec_type.from_dict({**valid, name: bad})
    assert str(caught.value) == f"{owner}.{name} must be {what}, got {bad!r}{fix}"


@pytest.mark.parametrize(("owner", "name", "what", "edge"), POSITIVE_FIELDS)
def test_positive_field_takes_its_edge_and_refuses_zero_or_null_where_it_must(owner, name, what, edge):
    spec_type, valid = _SPECS[owner]
    assert getattr(spec_type.from_dict({**valid, name: edge}), name) == edge
    for refused in [value for value in (0, None) if value != edge and not (value == 0 and ">= 0" in what)]:
        with pytest.raises(SpecError, match=f"{owner}.{name} must be {what}, got {refused!r}$"):
            spec_type.from_dict({**valid, name: refused})


@pytest.mark.parametrize(("spec_type", "valid"), [(TrainSpec, _SPECS["TrainSpec"][1]), (TuneSpec, _SPECS["TuneSpec"][1])])
@pytest.mark.parametrize(("fields", "message"), [
    ({"train_uri": ""}, ".train_uri must be a non-empty string, got ''"),
    ({"feature_columns": []}, ".feature_columns must be a non-empty list of column names, got []"),
    ({"feature_columns": ["a", "y"]}, ".label_column 'y' is also listed in feature_columns"),
    ({"classes": ["only"]}, ".classes must be null (regression) or a list of two or more distinct"),
    ({"preprocessor_variants": {"robust": "/d/r"}}, ".preprocessor_variants must map scalers"),
    ({"preprocessor_uri": " "}, ".preprocessor_uri must be a non-empty string, got ' '"),
    ({"data_fingerprint": 3}, ".data_fingerprint must be a string, got 3"),
])
def test_model_spec_bad_data_field_is_refused_naming_the_spec(spec_type, valid, fields, message):
    with pytest.raises(SpecError) as caught:
        spec_type.from_dict({**valid, **fields})
    assert str(caught.value).startswith(spec_type.__name__ + message), str(caught.value)


@pytest.mark.parametrize("spec_type", [TrainSpec, TuneSpec])
def test_model_spec_data_fields_stay_flat_in_its_json_and_name_their_place_in_the_preprocess_manifest(spec_type):
    valid = _SPECS[spec_type.__name__][1]
    spec = spec_type.from_dict({**valid, "classes": ["low", "high"], "data_fingerprint": "f1"})
    assert spec.to_dict()["classes"] == ["low", "high"] and spec.to_dict()["data_fingerprint"] == "f1"
    assert spec.task == "classification" and spec_type.from_json(spec.to_json()) == spec
    manifest_keys = {field.name for field in dataclasses.fields(PreprocessResult)}
    sources = preprocessed_fields(spec_type)
    assert set(sources) >= {"train_uri", "validation_uri", "feature_columns", "label_column", "data_fingerprint"}
    for name, source in sources.items():
        assert source.path[0] in manifest_keys, (name, source)
    assert ("test_uri" in sources) is (spec_type is TrainSpec)  # the test split is never an input of choosing
