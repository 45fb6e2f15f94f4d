"""Specs round-trip through JSON and reject bad values with messages that quote them."""

from __future__ import annotations

import pytest

from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.specs import GenerateResult, GenerateSpec, PreprocessSpec, TrainSpec, TuneSpec


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
