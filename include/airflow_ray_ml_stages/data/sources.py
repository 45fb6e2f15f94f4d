"""The data stage's input files: where they are, what their headers say, and their fingerprint.

A source is a local path, ``file://``, ``s3://``, ``gs://`` or ``http(s)://`` (downloaded into the
run's scratch directory first). :func:`inspect_source` reads only a file's first bytes (CSV) or
its footer (Parquet): format, delimiter and columns, and the header checks (empty file, wrong
delimiter, duplicate column names) that run before anything else.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from dataclasses import dataclass, field

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import DataSourceError, quotable
from airflow_ray_ml_stages.specs import PreprocessSpec
from airflow_ray_ml_stages.tables import PARQUET_SUFFIXES, colour_from_name, detect_delimiter, open_url
from airflow_ray_ml_stages.wine import TYPE_COLUMN


DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab"}
HEAD_BYTES = 64 * 1024
SAMPLE_ROWS = 3
HASH_CHUNK = 8 * 1024 * 1024


@dataclass
class SourceLayout:
    """One input file as the header check found it.

    :param uri: the source as the user named it (used in every message).
    :param path: what Ray Data reads: a local path or an ``s3://``/``gs://`` URI.
    :param derived: columns the file lacks but its name supplies (``type`` of the UCI red/white files).
    """

    uri: str
    path: str
    file_format: str
    delimiter: str | None
    columns: list[str]
    derived: dict[str, str] = field(default_factory=dict)
    head: bytes = b""
    size: int = 0

    @property
    def all_columns(self) -> list[str]:
        return [*self.columns, *self.derived]


def download(uri: str, scratch: str) -> str:
    """Stream an http(s) source into the scratch directory; return the local path."""
    name = os.path.basename(uri.split("?", 1)[0].rstrip("/")) or "download"
    target = os.path.join(scratch, f"{len(os.listdir(scratch))}-{name}")
    with open_url(uri) as response, open(target, "wb") as out:
        shutil.copyfileobj(response, out, HASH_CHUNK)
    return target


def reader_path(uri: str) -> str:
    """What the readers open for a local or remote ``uri``: an absolute path, or the URI itself."""
    if uri.startswith("file://"):
        return os.path.abspath(uri[len("file://"):])
    if artifacts.is_remote(uri):
        return uri
    return os.path.abspath(os.path.expanduser(uri))


def filesystem_of(path: str):
    """The pyarrow filesystem of ``path`` and the path within it."""
    filesystem, inner = artifacts.resolve(path)
    return filesystem, inner


def _file_format(uri: str, spec: PreprocessSpec) -> str:
    if spec.file_format != "auto":
        return spec.file_format
    return "parquet" if uri.lower().split("?", 1)[0].endswith(PARQUET_SUFFIXES) else "csv"


def _duplicates(columns: list[str]) -> list[str]:
    return sorted({column for column in columns if columns.count(column) > 1})


def inspect_source(uri: str, path: str, spec: PreprocessSpec) -> SourceLayout:
    """Check one file's header: not empty, the right delimiter, no duplicate column names."""
    filesystem, inner = filesystem_of(path)
    try:
        info = filesystem.get_file_info(inner)
        if info.type.name == "NotFound":
            raise FileNotFoundError(inner)
        size = info.size or 0
    except Exception as err:
        raise DataSourceError(f"cannot read {uri!r}: {err}. Give an existing local path or an s3://, gs:// or "
                              "http(s):// URL") from err
    if size == 0:
        raise DataSourceError(f"{uri!r} is empty (0 bytes): give a file with a header row and data rows")
    file_format = _file_format(uri, spec)
    if file_format == "parquet":
        import pyarrow.parquet as pq

        with filesystem.open_input_file(inner) as handle:
            parquet = pq.ParquetFile(handle)
            columns = list(parquet.schema_arrow.names)
            rows = parquet.metadata.num_rows
        if rows == 0:
            raise DataSourceError(f"{uri!r} has columns {columns} but no rows: give a file with data rows")
        layout = SourceLayout(uri, path, "parquet", None, columns, size=size)
    else:
        with filesystem.open_input_stream(inner) as stream:
            head = stream.read(HEAD_BYTES)
        text = head.decode("utf-8-sig", errors="replace")
        lines = text.splitlines()
        if not lines or not lines[0].strip():
            raise DataSourceError(f"{uri!r} has no header row on its first line: give a CSV file with a header")
        if not any(line.strip() for line in lines[1:]):
            raise DataSourceError(f"{uri!r} has a header ({quotable(lines[0])!r}) but no data rows")
        header = lines[0]
        delimiter = detect_delimiter(header) if spec.delimiter == "auto" else spec.delimiter
        columns = next(csv.reader([header], delimiter=delimiter, quotechar='"'))
        others = [other for other in DELIMITER_NAMES if other != delimiter and any(other in c for c in columns)]
        if others:
            other = others[0]
            raise DataSourceError(
                f"{uri!r}: the header looks {DELIMITER_NAMES[other]}-separated ({other!r}) but is read as "
                f"{DELIMITER_NAMES[delimiter]}-separated ({delimiter!r}): columns {quotable(columns)}; first rows "
                f"{quotable(lines[1:1 + SAMPLE_ROWS])}. Set delimiter={other!r} (or 'auto'); the UCI files use ';'"
            )
        layout = SourceLayout(uri, path, "csv", delimiter, columns, head=head, size=size)
    duplicates = _duplicates(layout.columns)
    if duplicates:
        raise DataSourceError(
            f"{uri!r} has duplicate column name(s) {duplicates} in its header {layout.columns}: "
            "rename them so each column name is unique"
        )
    colour = colour_from_name(uri)
    if colour and TYPE_COLUMN not in layout.columns:
        layout.derived[TYPE_COLUMN] = colour
    return layout


def fingerprint_sources(layouts: list[SourceLayout], out: dict[str, str]) -> None:
    """sha256 over the files' bytes in source order (what ``generate`` reports for its files)."""
    digest = hashlib.sha256()
    for layout in layouts:
        filesystem, inner = filesystem_of(layout.path)
        with filesystem.open_input_stream(inner) as stream:
            while chunk := stream.read(HASH_CHUNK):
                digest.update(chunk)
    out["fingerprint"] = "sha256:" + digest.hexdigest()
