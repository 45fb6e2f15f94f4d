"""Confined sources (airflow_ray_ml.confine): what a run's conf may name, decided without reading it."""

from __future__ import annotations

import json
import os

import pytest

from airflow_ray_ml.confine import AllowedSources, confine_sources, parse_setting
from airflow_ray_ml.errors import SourceNotAllowedError

WHERE = "the test's setting"


@pytest.fixture
def root(tmp_path):
    """An allowed root with a file in it, and a secret file beside it (outside)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "red.csv").write_text("a,b\n1,2\n")
    (tmp_path / "secret.ini").write_text("[default]\naws_secret_access_key = hunter2\n")
    return tmp_path


def _allowed(*roots: str) -> AllowedSources:
    return AllowedSources.of(roots, WHERE)


def _refusal(allowed: AllowedSources, source: str) -> str:
    with pytest.raises(SourceNotAllowedError) as caught:
        allowed.check(source)
    return str(caught.value)


def test_confine_file_under_a_root_is_returned_as_given(root):
    allowed = _allowed(str(root / "data"))
    for source in (str(root / "data" / "red.csv"), f"file://{root}/data/red.csv", str(root / "data"),
                   str(root / "data" / "not-yet-there.csv")):
        assert allowed.check(source) == source


def test_confine_etc_passwd_is_refused_naming_the_roots_and_the_setting(root):
    message = _refusal(_allowed(str(root / "data")), "/etc/passwd")
    assert message.startswith("the source '/etc/passwd' is not under the allowed sources [")
    assert os.path.realpath(root / "data") in message and message.endswith(f"or widen them: {WHERE}")
    assert "root:" not in message  # nothing of the file: it is never read


def test_confine_symlink_out_of_a_root_is_refused(root):
    (root / "data" / "innocent.csv").symlink_to(root / "secret.ini")
    (root / "data" / "etc").symlink_to("/etc")
    allowed = _allowed(str(root / "data"))
    for source in (str(root / "data" / "innocent.csv"), str(root / "data" / "etc" / "passwd")):
        message = _refusal(allowed, source)
        assert "leads out of them once symlinks, '..'" in message
        assert "hunter2" not in message and "secret.ini" not in message  # not even where the link points


def test_confine_dotdot_out_of_a_root_is_refused_and_inside_is_allowed(root):
    allowed = _allowed(str(root / "data"))
    assert "leads out of them" in _refusal(allowed, f"{root}/data/../secret.ini")
    assert "leads out of them" in _refusal(allowed, f"file://{root}/data/../../../etc/passwd")
    inside = f"{root}/data/sub/../red.csv"
    assert allowed.check(inside) == inside


def test_confine_symlinked_root_holds_its_files(root):
    (root / "link").symlink_to(root / "data")
    allowed = _allowed(str(root / "link"))  # a root is resolved too (/tmp -> /private/tmp on macOS)
    assert allowed.check(str(root / "data" / "red.csv")) and allowed.check(str(root / "link" / "red.csv"))


def test_confine_root_matches_whole_path_segments(root):
    allowed = _allowed(str(root / "data" / "red"))
    assert allowed.check(str(root / "data" / "red" / "2026.csv"))
    _refusal(allowed, str(root / "data" / "redacted.csv"))
    _refusal(allowed, str(root / "data"))


@pytest.mark.parametrize("source", ["etc/passwd", "~/.aws/credentials", "file://etc/passwd", "FILE:///etc/passwd", ""])
def test_confine_relative_home_or_odd_local_sources_are_refused(root, source):
    # a relative path would be read from the Ray job's own directory, ~ from its user's home
    _refusal(_allowed("/"), source)


PREFIXES = ("https://data.example.com/pub/", "s3://bucket/team/raw", "gs://lake/wine", "http://10.0.0.5:8080/files")


@pytest.mark.parametrize("source", [
    "https://data.example.com/pub/wine.csv",
    "https://DATA.example.com:443/pub/2026/wine.csv?sig=abc",
    "s3://bucket/team/raw/2026-11.parquet",
    "gs://lake/wine/red.csv",
    "http://10.0.0.5:8080/files/a.csv",
])
def test_confine_url_under_a_prefix_is_allowed(source):
    assert _allowed(*PREFIXES).check(source) == source


@pytest.mark.parametrize("source", [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",  # a cloud metadata address
    "http://data.example.com/pub/wine.csv",  # another scheme
    "https://data.example.com:8443/pub/wine.csv",  # another port
    "https://data.example.com/public/wine.csv",  # beside the prefix's path
    "https://data.example.com/pub/../admin/keys",  # '..' out of it
    "https://data.example.com/pub/%2e%2e/admin/keys",  # the same, escaped
    "https://data.example.com.evil.net/pub/wine.csv",
    "https://data.example.com@169.254.169.254/pub/wine.csv",  # a user name that looks like the host
    "s3://bucket/team/rawdata/x.parquet",
    "s3://other-bucket/team/raw/x.parquet",
    "gs://bucket/team/raw/x.parquet",  # the right path on another store
    "http://10.0.0.5/files/a.csv",  # the default port is another port
])
def test_confine_url_outside_the_prefixes_is_refused(source):
    _refusal(_allowed(*PREFIXES), source)


def test_confine_refusal_quotes_a_url_without_credentials_or_query():
    message = _refusal(_allowed(*PREFIXES), "https://user:pa55word@internal.example.com/x.csv?token=t0ps3cret#f")
    assert "'https://internal.example.com/x.csv'" in message
    assert "pa55word" not in message and "t0ps3cret" not in message and "user" not in message


@pytest.mark.parametrize(("value", "expected"), [
    (None, []), ("", []), ('["/srv/data", "s3://b/p"]', ["/srv/data", "s3://b/p"]),
    ("/srv/data, s3://b/p\nhttps://h/x\n", ["/srv/data", "s3://b/p", "https://h/x"]), (["/a"], ["/a"]),
])
def test_confine_setting_reads_a_list_json_or_lines(value, expected):
    assert parse_setting(value) == expected


@pytest.mark.parametrize("value", ['["/a",', {"root": "/a"}, [1]])
def test_confine_setting_that_is_not_a_list_fails_naming_it(value):
    with pytest.raises(SourceNotAllowedError, match="allowed_sources must be a list of paths or URL prefixes"):
        parse_setting(value)


@pytest.mark.parametrize("root", ["data/", "https:///nohost"])
def test_confine_root_that_is_not_absolute_or_has_no_host_fails_naming_it(root):
    with pytest.raises(SourceNotAllowedError, match=f"{WHERE}: the root"):
        _allowed(root)


def _connection(monkeypatch, artifact_root, **extra) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TEST", json.dumps({
        "conn_type": "ray_ml", "extra": {"dashboard_url": "http://127.0.0.1:1", "artifact_root": str(artifact_root),
                                      **extra}}))


def test_confine_sources_allows_the_artifact_roots_data_folder_by_default(monkeypatch, tmp_path, root):
    _connection(monkeypatch, tmp_path)  # root's data folder is tmp_path/data
    source = str(tmp_path / "data" / "red.csv")
    assert confine_sources([source], ray_conn_id="ray_test") == [source]
    assert confine_sources(source, ray_conn_id="ray_test") == [source]
    with pytest.raises(SourceNotAllowedError) as caught:
        confine_sources([source, str(tmp_path / "secret.ini")], ray_conn_id="ray_test")
    assert str(caught.value).endswith(
        "add a path or URL prefix to the 'allowed_sources' field of the Airflow connection 'ray_test' "
        "(docs/deployment.md#confined-sources)")


def test_confine_sources_setting_widens_the_roots(monkeypatch, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    source = str(elsewhere / "rent.csv")
    _connection(monkeypatch, tmp_path / "artifacts")
    with pytest.raises(SourceNotAllowedError):
        confine_sources([source], ray_conn_id="ray_test")
    _connection(monkeypatch, tmp_path / "artifacts", allowed_sources=f"{elsewhere}\nhttps://data.example.com/pub")
    assert confine_sources([source, "https://data.example.com/pub/a.csv"], ray_conn_id="ray_test") == [
        source, "https://data.example.com/pub/a.csv"]
    # the artifact root's data folder stays allowed beside the setting's roots
    assert confine_sources([str(tmp_path / "artifacts" / "data" / "x.csv")], ray_conn_id="ray_test")
