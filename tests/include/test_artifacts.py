"""Artifact layout and atomic writes on the local filesystem through pyarrow.fs."""

from __future__ import annotations

import json
import os
import threading

import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import ArtifactError


def test_run_dir_layout_is_root_dag_run_task(tmp_path):
    path = artifacts.run_dir(str(tmp_path), "wine", "manual__2026-01-01T00:00:00+00:00", "train")
    assert path == f"{tmp_path}/wine/manual__2026-01-01T00_00_00_00_00/train"


def test_run_dir_mapped_task_gets_its_index(tmp_path):
    assert artifacts.run_dir("s3://bucket/ml", "d", "r", "t", 3) == "s3://bucket/ml/d/r/t.3"


def test_run_dir_different_runs_never_share_a_directory():
    a = artifacts.run_dir("/root", "d", "scheduled__2026-01-01T00:00:00+00:00", "t")
    b = artifacts.run_dir("/root", "d", "scheduled__2026-01-08T00:00:00+00:00", "t")
    assert a != b


def test_write_json_atomic_then_read_back(tmp_path):
    uri = artifacts.join(str(tmp_path), "a", "b", "manifest.json")
    artifacts.write_json_atomic(uri, {"x": 1})
    assert artifacts.read_json(uri) == {"x": 1}
    assert os.listdir(tmp_path / "a" / "b") == ["manifest.json"]  # no temporary file left behind


def test_write_json_atomic_readers_never_see_a_torn_file(tmp_path):
    uri = str(tmp_path / "manifest.json")
    big = {"values": list(range(50_000))}
    artifacts.write_json_atomic(uri, big)
    errors: list[Exception] = []

    def read_many():
        for _ in range(200):
            try:
                assert artifacts.read_json(uri)["values"][-1] == 49_999
            except Exception as err:  # a torn read would fail to parse
                errors.append(err)

    reader = threading.Thread(target=read_many)
    reader.start()
    for _ in range(30):
        artifacts.write_json_atomic(uri, big)
    reader.join()
    assert errors == []


def test_file_uri_and_plain_path_are_the_same_place(tmp_path):
    artifacts.write_bytes_atomic(f"file://{tmp_path}/x.bin", b"abc")
    assert artifacts.read_bytes(str(tmp_path / "x.bin")) == b"abc"
    assert artifacts.exists(str(tmp_path / "x.bin"))


def test_read_missing_artifact_names_it(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        artifacts.read_json(str(tmp_path / "nope.json"))


def test_read_invalid_json_names_it(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ArtifactError, match="bad.json.*not valid JSON"):
        artifacts.read_json(str(tmp_path / "bad.json"))


def test_unsupported_scheme_says_which_are(tmp_path):
    with pytest.raises(ArtifactError, match="s3://"):
        artifacts.resolve("ftp://host/path")


def test_safe_segment_rejects_empty():
    with pytest.raises(ArtifactError):
        artifacts.safe_segment("///")
    assert json.dumps(artifacts.safe_segment("a b:c")) == '"a_b_c"'
