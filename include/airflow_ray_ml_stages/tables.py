"""Read tabular sources: CSV (comma or the UCI semicolon layout) and Parquet, local or remote.

Sources are local paths, ``file://``, ``s3://``, ``gs://`` or ``http(s)://`` URLs. A file whose
name says ``red`` or ``white`` and that has no ``type`` column (the published UCI wine files) gets
that column, so the two colours can be read together.
"""

from __future__ import annotations

import hashlib
import io
import os
from contextlib import contextmanager
from typing import Iterable

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import DataSourceError
from airflow_ray_ml_stages.wine import TYPE_COLUMN

PARQUET_SUFFIXES = (".parquet", ".pq")
HTTP_TIMEOUT_S = 60


@contextmanager
def open_url(uri: str):
    """The http(s) response for ``uri``; any I/O error in the block becomes a DataSourceError naming it."""
    import urllib.request  # only here: it costs every stage's start-up ~15 ms

    try:
        with urllib.request.urlopen(uri, timeout=HTTP_TIMEOUT_S) as response:
            yield response
    except (TimeoutError, OSError) as err:  # URLError is an OSError
        raise DataSourceError(f"cannot download {uri!r}: {err}. Check the URL and the network") from err


def read_source_bytes(source: str) -> bytes:
    """Return the raw bytes of one source, with an error that names it when it cannot be read."""
    if source.startswith(("http://", "https://")):
        with open_url(source) as response:
            return response.read()
    try:
        return artifacts.read_bytes(source)
    except Exception as err:
        raise DataSourceError(
            f"cannot read {source!r}: {err}. Give an existing local path or an s3://, gs:// or http(s):// URL"
        ) from err


def detect_delimiter(header_line: str) -> str:
    """Pick the CSV delimiter from the header: the UCI files use ``;``, most others ``,``."""
    candidates = {delimiter: header_line.count(delimiter) for delimiter in (";", ",", "\t")}
    best = max(candidates, key=lambda delimiter: candidates[delimiter])
    return best if candidates[best] > 0 else ","


def fingerprint(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def colour_from_name(source: str) -> str | None:
    """``red`` or ``white`` when the file's name says exactly one of them (the UCI files), else None."""
    name = os.path.basename(source.rstrip("/")).lower()
    colours = [colour for colour in ("red", "white") if colour in name]
    return colours[0] if len(colours) == 1 else None


def parse_table(source: str, data: bytes) -> pd.DataFrame:
    """Parse bytes read from ``source`` into a DataFrame (Parquet by suffix, CSV otherwise)."""
    import pandas as pd

    if not data.strip():
        raise DataSourceError(f"{source!r} is empty: give a file with a header row and data rows")
    if source.lower().split("?", 1)[0].endswith(PARQUET_SUFFIXES):
        try:
            return pd.read_parquet(io.BytesIO(data))
        except Exception as err:
            raise DataSourceError(f"{source!r} is not a readable Parquet file: {err}") from err
    text = data.decode("utf-8-sig", errors="replace")
    delimiter = detect_delimiter(text.splitlines()[0])
    try:
        return pd.read_csv(io.StringIO(text), sep=delimiter, quotechar='"')
    except Exception as err:
        raise DataSourceError(f"{source!r} is not a readable CSV file: {err}") from err


def read_table(source: str) -> pd.DataFrame:
    """Read one source into a DataFrame."""
    frame = parse_table(source, read_source_bytes(source))
    colour = colour_from_name(source)
    if colour and TYPE_COLUMN not in frame.columns:
        frame.insert(0, TYPE_COLUMN, colour)
    return frame


def read_tables(sources: Iterable[str]) -> pd.DataFrame:
    """Read and stack several sources that share one schema (the red and white UCI files)."""
    import pandas as pd

    sources = list(sources)
    if not sources:
        raise DataSourceError("no data source given: name at least one file or URL")
    frames = [read_table(source) for source in sources]
    first = list(frames[0].columns)
    for source, frame in zip(sources[1:], frames[1:]):
        if sorted(frame.columns) != sorted(first):
            raise DataSourceError(
                f"{source!r} has columns {list(frame.columns)}, but {sources[0]!r} has {first}; "
                "sources read together must share one schema"
            )
    return pd.concat([frame.loc[:, first] for frame in frames], ignore_index=True)
