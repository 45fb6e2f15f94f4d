"""The loader reads the UCI files as published, comma CSV and Parquet, from paths and over HTTP."""

from __future__ import annotations

import functools
import http.server
import threading

import pandas as pd
import pytest

from airflow_ray_ml_stages import wine
from airflow_ray_ml_stages.errors import DataSourceError
from airflow_ray_ml_stages.tables import detect_delimiter, read_table, read_tables


@pytest.fixture(scope="module")
def frame():
    return wine.generate(rows=400, seed=11)


@pytest.fixture()
def uci_files(tmp_path, frame):
    paths = []
    for colour in ("red", "white"):
        path = tmp_path / f"winequality-{colour}.csv"
        path.write_bytes(wine.to_uci_csv(frame[frame[wine.TYPE_COLUMN] == colour]))
        paths.append(str(path))
    return paths


def test_uci_files_read_together_equal_the_generated_frame(uci_files, frame):
    loaded = read_tables(uci_files)
    pd.testing.assert_frame_equal(loaded, frame, check_dtype=False)


def test_uci_semicolon_comma_csv_and_parquet_read_the_same(tmp_path, uci_files, frame):
    frame.to_csv(tmp_path / "wine.csv", index=False)
    frame.to_parquet(tmp_path / "wine.parquet", index=False)
    from_uci = read_tables(uci_files)
    pd.testing.assert_frame_equal(read_table(str(tmp_path / "wine.csv")), from_uci, check_dtype=False)
    pd.testing.assert_frame_equal(read_table(str(tmp_path / "wine.parquet")), from_uci, check_dtype=False)


def test_read_over_http_from_a_local_server(tmp_path, uci_files, frame):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        loaded = read_tables([f"{base}/winequality-red.csv", f"{base}/winequality-white.csv"])
        with pytest.raises(DataSourceError, match="cannot download.*missing.csv"):
            read_table(f"{base}/missing.csv")
    finally:
        server.shutdown()
    pd.testing.assert_frame_equal(loaded, frame, check_dtype=False)


@pytest.mark.parametrize(("header", "delimiter"), [('"a";"b";"c"', ";"), ("a,b,c", ","), ("a\tb", "\t"), ("a", ",")])
def test_detect_delimiter(header, delimiter):
    assert detect_delimiter(header) == delimiter


def test_missing_file_error_names_it(tmp_path):
    with pytest.raises(DataSourceError, match="nope.csv"):
        read_table(str(tmp_path / "nope.csv"))


def test_empty_file_error_says_what_to_give(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataSourceError, match="empty.csv.*is empty"):
        read_table(str(tmp_path / "empty.csv"))


def test_sources_with_different_schemas_are_refused(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv").write_text("x,z\n1,2\n")
    with pytest.raises(DataSourceError, match="share one schema"):
        read_tables([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])
