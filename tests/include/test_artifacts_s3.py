"""Artifact storage on a real S3-compatible server: what the Airflow side reads and writes with the
credentials of its storage connection, and the Ray side with the environment's."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import ArtifactError

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_credentials(s3_server):
    artifacts.use_s3_credentials(s3_server.access_key, s3_server.secret_key, endpoint_url=s3_server.endpoint_url)
    yield s3_server
    artifacts.forget_s3_credentials()


def test_json_round_trip_exists_and_missing_objects(s3_credentials, tmp_path):
    root = f"s3://{s3_credentials.bucket}/unit/{tmp_path.name}"
    uri = artifacts.join(root, "d", "manifest.json")
    assert not artifacts.exists(uri)
    artifacts.write_json_atomic(uri, {"status": "succeeded", "n": 3})
    assert artifacts.exists(uri) and artifacts.read_json(uri) == {"status": "succeeded", "n": 3}
    artifacts.write_json_atomic(uri, {"status": "failed"})  # a second write replaces the object whole
    assert artifacts.read_json(uri) == {"status": "failed"}
    assert f"{s3_credentials.bucket}/unit/{tmp_path.name}/d/manifest.json" in s3_credentials.keys("unit")
    with pytest.raises(ArtifactError, match="does not exist"):
        artifacts.read_json(artifacts.join(root, "nothing.json"))


def test_multipart_parquet_written_and_read_through_the_resolved_filesystem(s3_credentials, tmp_path):
    filesystem, path = artifacts.resolve(f"s3://{s3_credentials.bucket}/unit/{tmp_path.name}/big.parquet")
    rows = 400_000  # ~6 MB of Parquet: more than one part of pyarrow's multipart upload
    table = pa.table({"x": pa.array(range(rows), pa.int64()), "y": pa.array([float(i) * 0.5 for i in range(rows)])})
    pq.write_table(table, path, filesystem=filesystem, compression="none")
    assert filesystem.get_file_info(path).size > 5 * 2**20
    assert pq.read_table(path, filesystem=filesystem).equals(table)
    filesystem.move(path, path + ".moved")
    assert pq.read_table(path + ".moved", filesystem=filesystem).num_rows == rows


def test_wrong_credentials_are_refused_by_the_server(s3_server, tmp_path):
    artifacts.use_s3_credentials(s3_server.access_key, "not-the-secret", endpoint_url=s3_server.endpoint_url)
    try:
        with pytest.raises(OSError):
            artifacts.write_json_atomic(f"s3://{s3_server.bucket}/unit/{tmp_path.name}/x.json", {})
    finally:
        artifacts.forget_s3_credentials()


def test_an_endpoint_without_a_host_is_refused():
    with pytest.raises(ArtifactError, match="names no host"):
        artifacts.use_s3_credentials("a", "b", endpoint_url="http://")


def test_credentials_serve_the_longest_prefix_so_two_roots_keep_their_own(s3_server, tmp_path):
    bucket = s3_server.bucket
    good, other = f"s3://{bucket}/unit/{tmp_path.name}/good", f"s3://{bucket}/unit/{tmp_path.name}/other"
    artifacts.use_s3_credentials(s3_server.access_key, "not-the-secret", endpoint_url=s3_server.endpoint_url)
    artifacts.use_s3_credentials(s3_server.access_key, s3_server.secret_key, endpoint_url=s3_server.endpoint_url,
                                 prefix=good)
    try:
        artifacts.write_json_atomic(artifacts.join(good, "m.json"), {"ok": True})  # the root's own credentials
        assert artifacts.read_json(artifacts.join(good, "m.json")) == {"ok": True}
        with pytest.raises(OSError):  # another root, and a name that only starts like the root's, take s3://'s
            artifacts.write_json_atomic(artifacts.join(other, "m.json"), {})
        with pytest.raises(OSError):
            artifacts.write_json_atomic(f"{good}-not-under-it/m.json", {})
    finally:
        artifacts.forget_s3_credentials()
    with pytest.raises(ArtifactError, match="s3:// URIs"):
        artifacts.use_s3_credentials("a", "b", prefix="gs://bucket")


def test_hook_reads_the_artifact_root_with_its_storage_connection_only(s3_server, monkeypatch, tmp_path):
    from airflow_ray_ml.hooks.ray import RayHook

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    root = f"s3://{s3_server.bucket}/hook/{tmp_path.name}"
    monkeypatch.setenv("AIRFLOW_CONN_RAYML_UNIT_S3", json.dumps({
        "conn_type": "aws", "login": s3_server.access_key, "password": s3_server.secret_key,
        "extra": {"endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_RAYML_UNIT_RAY", json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": "http://127.0.0.1:1", "artifact_root": root, "storage_conn_id": "rayml_unit_s3"}}))
    monkeypatch.setenv("AIRFLOW_CONN_RAYML_UNIT_MISSING", json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": "http://127.0.0.1:1", "artifact_root": root, "storage_conn_id": "no_such_conn"}}))
    try:
        assert RayHook("rayml_unit_ray").artifact_root == root
        artifacts.write_json_atomic(artifacts.join(root, "serving", "app", "history.json"), [{"action": "promoted"}])
        assert f"{s3_server.bucket}/hook/{tmp_path.name}/serving/app/history.json" in s3_server.keys("hook")
        with pytest.raises(Exception, match="storage connection 'no_such_conn'.*clear 'storage_conn_id'"):
            RayHook("rayml_unit_missing").artifact_root
    finally:
        artifacts.forget_s3_credentials()
