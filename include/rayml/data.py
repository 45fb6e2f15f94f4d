"""Stage ``data``: validate, split, fit a scaler on the train split and write Parquet.

Two streaming passes over the sources, so a table larger than memory is never loaded whole:

1. *profile*: every batch is checked (non-numeric, NaN/infinite/missing values, labels out of
   range) and summarised per split (row counts, mergeable moments, category and label counts);
   the summaries are merged. Any failed check raises here, before anything is written. Header
   checks (empty file, wrong delimiter, duplicate, missing or unexpected columns) run even
   earlier, on the first bytes of each file.
2. *write*: every batch is transformed by the preprocessor fitted on the train split's summary
   and written as Parquet, one directory per split.

Two engines run the same per-batch functions (:func:`choose_engine` picks one):

- ``direct``: pyarrow in the job's driver, batches processed on a thread per core; pass 1 keeps
  the canonical kept rows and their split in local Arrow IPC scratch files, so pass 2 neither
  parses the input again nor rehashes. No Ray Data start-up, no ``ray.init``.
- ``ray_data``: Ray Data tasks across the cluster (one fused read -> map -> write task per file),
  for inputs large enough that other nodes' CPUs pay for its start-up.

A row's split is a seeded hash of its content (the values of its used columns, in sorted column
order), so the same input and seed give the same split membership whatever the engine, the
block count, the number of CPUs, the order of the files or their format (UCI semicolon, comma CSV
or Parquet).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from rayml import artifacts
from rayml.errors import DataSourceError
from rayml.preprocessor import Moments, Preprocessor
from rayml.constants import SCALERS
from rayml.specs import PreprocessResult, PreprocessSpec
from rayml.stage import main_of, run_stage
from rayml.tables import PARQUET_SUFFIXES, colour_from_name, detect_delimiter, open_url
from rayml.wine import TYPE_COLUMN

log = logging.getLogger("rayml.data")

SPLITS = ("train", "validation", "test")
DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab"}
HEAD_BYTES = 64 * 1024
SAMPLE_ROWS = 3
HASH_CHUNK = 8 * 1024 * 1024
BATCH_ROWS = 131_072  # rows per map_batches call: bounds each worker's intermediates (see _run)
MAX_FILE_BLOCK_BYTES = 256 * 1024 * 1024  # input bytes per Ray Data block by default (see read_dataset)
PATH_COLUMN = "path"
SPLIT_COLUMN = "split"
# Values pyarrow's CSV reader turns into null in a float column (its default null_values), which
# are missing values, not non-numeric ones.
NULL_TOKENS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                         "1.#QNAN", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null"})


# -- sources and their headers -------------------------------------------------------------------

# -- pandas, only when needed --------------------------------------------------------------------
# The direct engine works on numpy and pyarrow alone, but pyarrow imports pandas (about 0.17 s of
# the job's start, with the GIL held) on its first numpy conversion, only to learn pandas' missing
# value sentinels, which float, integer and string columns do not need. ``pandas_deferred`` keeps
# that import out of the job; the slow paths that do use pandas ask for it with ``_pandas()``.

class _DeferPandas:
    """A ``sys.meta_path`` finder that refuses to import pandas while it is installed."""

    def find_spec(self, name: str, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is deferred in the direct engine: call rayml.data._pandas()")
        return None


_DEFER_PANDAS = _DeferPandas()
_DEFER_LOCK = threading.Lock()


def _lift_pandas_block() -> bool:
    with _DEFER_LOCK:
        if _DEFER_PANDAS not in sys.meta_path:
            return False
        sys.meta_path.remove(_DEFER_PANDAS)
        return True


def _pandas():
    """Import pandas (lifting a ``pandas_deferred`` block first) and return it."""
    if _lift_pandas_block():
        # pyarrow remembers a failed import; an explicit request makes it try again.
        import pyarrow.lib

        pyarrow.lib._pandas_api.compat  # noqa: B018 - the property re-imports pandas into pyarrow
    import pandas

    return pandas


@contextmanager
def pandas_deferred():
    """Keep pandas unimported inside the block unless something calls :func:`_pandas`.

    A no-op where pandas is already imported (in-process callers, tests).
    """
    if "pandas" in sys.modules or _DEFER_PANDAS in sys.meta_path:
        yield
        return
    sys.meta_path.insert(0, _DEFER_PANDAS)
    try:
        yield
    finally:
        _lift_pandas_block()


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


def _download(uri: str, scratch: str) -> str:
    """Stream an http(s) source into the scratch directory; return the local path."""
    name = os.path.basename(uri.split("?", 1)[0].rstrip("/")) or "download"
    target = os.path.join(scratch, f"{len(os.listdir(scratch))}-{name}")
    with open_url(uri) as response, open(target, "wb") as out:
        shutil.copyfileobj(response, out, HASH_CHUNK)
    return target


def _reader_path(uri: str) -> str:
    if uri.startswith("file://"):
        return os.path.abspath(uri[len("file://"):])
    if artifacts.is_remote(uri):
        return uri
    return os.path.abspath(os.path.expanduser(uri))


def _open(path: str):
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
    filesystem, inner = _open(path)
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
            raise DataSourceError(f"{uri!r} has a header ({lines[0][:200]!r}) but no data rows")
        header = lines[0]
        delimiter = detect_delimiter(header) if spec.delimiter == "auto" else spec.delimiter
        columns = next(csv.reader([header], delimiter=delimiter, quotechar='"'))
        others = [other for other in DELIMITER_NAMES if other != delimiter and any(other in c for c in columns)]
        if others:
            other = others[0]
            raise DataSourceError(
                f"{uri!r}: the header looks {DELIMITER_NAMES[other]}-separated ({other!r}) but is read as "
                f"{DELIMITER_NAMES[delimiter]}-separated ({delimiter!r}): columns {columns}; first rows "
                f"{lines[1:1 + SAMPLE_ROWS]}. Set delimiter={other!r} (or 'auto'); the UCI files use ';'"
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


# -- which columns are what ----------------------------------------------------------------------

@dataclass
class ColumnPlan:
    numeric: list[str]
    categorical: list[str]
    label: str

    @property
    def features(self) -> list[str]:
        return [*self.numeric, *self.categorical]

    @property
    def used(self) -> list[str]:
        return [*self.features, self.label]

    @property
    def hashed(self) -> list[str]:
        """The columns whose values decide a row's split, in a fixed order."""
        return sorted(self.used)


def _looks_categorical(layout: SourceLayout, column: str) -> bool:
    """True when every non-empty value of ``column`` in the file's first rows is non-numeric."""
    if column in layout.derived:
        return True
    if layout.file_format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        filesystem, inner = _open(layout.path)
        with filesystem.open_input_file(inner) as handle:
            kind = pq.ParquetFile(handle).schema_arrow.field(column).type
        return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind)
    import pyarrow as pa
    import pyarrow.csv as pacsv

    complete = layout.head[: layout.head.rfind(b"\n") + 1] or layout.head
    sample = pacsv.read_csv(
        pa.py_buffer(complete), read_options=pacsv.ReadOptions(use_threads=False),
        parse_options=pacsv.ParseOptions(delimiter=layout.delimiter, invalid_row_handler=lambda row: "skip"),
        convert_options=pacsv.ConvertOptions(column_types={column: pa.string()}, include_columns=[column],
                                             strings_can_be_null=False),
    )[column].to_pylist()
    values = [value.strip() for value in sample if value.strip() not in NULL_TOKENS]
    return bool(values) and not any(_is_number(value) for value in values)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def plan_columns(layouts: list[SourceLayout], spec: PreprocessSpec) -> ColumnPlan:
    """Check the files' columns against each other and the spec; decide numeric vs categorical."""
    first = layouts[0]
    reference = first.all_columns
    for layout in layouts[1:]:
        missing = [c for c in reference if c not in layout.all_columns]
        unexpected = [c for c in layout.all_columns if c not in reference]
        if missing or unexpected:
            raise DataSourceError(
                f"{layout.uri!r} has columns {layout.all_columns} but {first.uri!r} has {reference}: "
                f"missing {missing}, unexpected {unexpected}. Files read together must share one schema"
            )
    for layout in layouts:
        if spec.label_column not in layout.all_columns:
            raise DataSourceError(
                f"{layout.uri!r} has no label column {spec.label_column!r}; its columns are "
                f"{layout.all_columns}. Set label_column to one of them"
            )
        if spec.feature_columns is not None:
            missing = [c for c in spec.feature_columns if c not in layout.all_columns]
            if missing:
                raise DataSourceError(
                    f"{layout.uri!r} lacks feature column(s) {missing}; its columns are {layout.all_columns}"
                )
            allowed = {*spec.feature_columns, spec.label_column, *spec.drop_columns}
            unexpected = [c for c in layout.all_columns if c not in allowed]
            if unexpected:
                raise DataSourceError(
                    f"{layout.uri!r} has unexpected column(s) {unexpected} (not in feature_columns, the label "
                    f"or drop_columns); add them to drop_columns to ignore them, or to feature_columns to use them"
                )
    features = spec.feature_columns or [
        c for c in reference if c != spec.label_column and c not in spec.drop_columns
    ]
    if not features:
        raise DataSourceError(f"{first.uri!r} has no feature columns besides the label {spec.label_column!r}")
    if spec.categorical_columns is not None:
        stray = [c for c in spec.categorical_columns if c not in features]
        if stray:
            raise DataSourceError(f"categorical column(s) {stray} are not feature columns of {first.uri!r}: {features}")
        categorical = [c for c in features if c in spec.categorical_columns]
    else:
        categorical = [c for c in features if _looks_categorical(first, c)]
    numeric = [c for c in features if c not in categorical]
    return ColumnPlan(numeric, categorical, spec.label_column)


# -- per-batch logic (pure pandas/numpy; Ray calls it on every batch) ----------------------------

@dataclass
class BatchContext:
    """What every batch function needs, as JSON-able fields shipped to the Ray tasks."""

    numeric: list[str]
    categorical: list[str]
    label: str
    split: list[float]
    seed: int
    nan_policy: str
    label_range: list[float] | None
    sources: dict[str, str]  # the path Ray reports -> the source URI
    derived: dict[str, dict[str, str]]  # source URI -> {column: value}

    @property
    def plan(self) -> ColumnPlan:
        return ColumnPlan(self.numeric, self.categorical, self.label)

    def source_of(self, path: str) -> str:
        if path in self.sources:
            return self.sources[path]
        for known, uri in self.sources.items():  # stores differ in how they report paths
            if known.endswith(path) or path.endswith(known.split("://", 1)[-1]):
                return uri
        return path


def _hash_key(seed: int) -> str:
    return hashlib.sha256(f"rayml-split-{seed}".encode()).hexdigest()[:16]


def _split_of_hashes(hashed: np.ndarray, fractions: list[float]) -> np.ndarray:
    uniform = (hashed >> np.uint64(11)).astype("float64") * 2.0**-53
    bounds = np.cumsum(fractions)[:2]
    return np.searchsorted(bounds, uniform, side="right").astype("int8")


# The row hash is pandas' ``hash_pandas_object(frame, index=False)`` (the split of a row must never
# change), computed with numpy alone so the direct engine's job does not import pandas (~0.35 s).
# A test checks it against pandas bit for bit.
_MASK64 = 0xFFFFFFFFFFFFFFFF
_NAN_BITS = np.array(np.nan, dtype="float64").view("uint64")
_NEGATIVE_ZERO_BITS = np.array(-0.0, dtype="float64").view("uint64")


def _rotate(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under a 16-byte key (what pandas hashes strings with)."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rounds(count: int) -> None:
        for _ in range(count):
            v[0] = (v[0] + v[1]) & _MASK64
            v[1] = _rotate(v[1], 13) ^ v[0]
            v[0] = _rotate(v[0], 32)
            v[2] = (v[2] + v[3]) & _MASK64
            v[3] = _rotate(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & _MASK64
            v[3] = _rotate(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & _MASK64
            v[1] = _rotate(v[1], 17) ^ v[2]
            v[2] = _rotate(v[2], 32)

    whole = len(data) // 8 * 8
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        v[3] ^= word
        rounds(2)
        v[0] ^= word
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v[3] ^= last
    rounds(2)
    v[0] ^= last
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def _spread(values: np.ndarray) -> np.ndarray:
    """pandas' final mixing of 64-bit hashes (in place)."""
    values ^= values >> np.uint64(30)
    values *= np.uint64(0xBF58476D1CE4E5B9)
    values ^= values >> np.uint64(27)
    values *= np.uint64(0x94D049BB133111EB)
    values ^= values >> np.uint64(31)
    return values


def _hash_floats(values: np.ndarray) -> np.ndarray:
    """``pd.util.hash_array`` of a float64 array (NaNs and -0.0 canonicalised first)."""
    bits = values.view("uint64").copy()
    bits[np.isnan(values)] = _NAN_BITS
    bits[bits == _NEGATIVE_ZERO_BITS] = 0
    return _spread(bits)


def _hash_category_codes(codes: np.ndarray, values: list, key: str) -> np.ndarray:
    """``pd.util.hash_array`` of a Categorical with these codes (-1: missing) and string categories."""
    hashed = _spread(np.array([siphash24(key.encode("utf8"), str(value).encode("utf8")) for value in values],
                              dtype="uint64"))
    result = hashed.take(codes) if len(hashed) else np.zeros(len(codes), dtype="uint64")
    result[codes < 0] = np.uint64(_MASK64)
    return result


def _hash_columns(columns: list, seed: int) -> np.ndarray:
    """``pd.util.hash_pandas_object(pd.DataFrame(columns), index=False)``, without pandas.

    Each column is a float64 array or a ``(codes, values)`` pair of a categorical column; each is
    hashed as ``pd.util.hash_array`` does and the hashes are combined as pandas does
    (``pandas.core.util.hashing.combine_hash_arrays``), so the two give identical values.
    """
    key = _hash_key(seed)
    rows = len(columns[0][0]) if isinstance(columns[0], tuple) else len(columns[0])
    out = np.zeros(rows, dtype="uint64") + np.uint64(0x345678)
    mult = np.uint64(1000003)
    for index, column in enumerate(columns):
        inverse = len(columns) - index
        out ^= _hash_category_codes(*column, key) if isinstance(column, tuple) else _hash_floats(column)
        out *= mult
        mult += np.uint64(82520 + inverse + inverse)
    out += np.uint64(97531)
    return out


def _categorical(values: np.ndarray) -> tuple[np.ndarray, list]:
    """An object column as codes into its distinct values (-1: missing): each value hashed once."""
    pd = _pandas()

    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, list(uniques)


def assign_splits(frame: pd.DataFrame, columns: list[str], fractions: list[float], seed: int) -> np.ndarray:
    """Split index (0 train, 1 validation, 2 test) of each row, from a seeded hash of its values."""
    pd = _pandas()

    if frame.empty:
        return np.zeros(0, dtype="int8")
    # Canonical types first: a value hashes the same whether it came from CSV, Parquet or pandas.
    canonical = [frame[column].to_numpy(dtype="float64") if pd.api.types.is_numeric_dtype(frame[column])
                 else _categorical(frame[column].to_numpy(dtype=object)) for column in columns]
    return _split_of_hashes(_hash_columns(canonical, seed), fractions)


def _codes_numpy(indices) -> np.ndarray:
    """A dictionary array's indices as int32 numpy codes, -1 where missing (without pyarrow.compute)."""
    if not indices.null_count:
        return indices.to_numpy(zero_copy_only=False).astype("int32", copy=False)
    found = indices.to_numpy(zero_copy_only=False)  # float64, NaN where missing
    return np.where(np.isnan(found), -1, found).astype("int32")


def _joined(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    """Per-chunk arrays as one array (no copy for a single chunk)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _float_numpy(column) -> np.ndarray:
    """A float64 chunked column as one numpy array, NaN where missing."""
    return _joined([chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks], "float64")


def _dictionary_codes(column) -> tuple[np.ndarray, list]:
    """Codes (-1: missing) into the distinct values of a dictionary<string> column, chunks unified.

    The CSV reader dictionary-encodes categorical columns itself; reading its codes here saves
    pyarrow.compute (``dictionary_encode``, ``fill_null``), whose import alone costs ~40 ms.
    """
    position: dict[str, int] = {}
    parts = []
    for chunk in column.chunks:
        lookup = np.array([position.setdefault(value, len(position)) for value in chunk.dictionary.to_pylist()]
                          + [-1], dtype="int32")
        parts.append(lookup[_codes_numpy(chunk.indices)])  # -1 (missing) picks the trailing -1
    return _joined(parts, "int32"), list(position)


@dataclass
class Batch:
    """One batch in canonical types, as arrays (what every per-batch step works on).

    :param numeric: float64 matrix, rows x (numeric columns, then the label); missing values NaN.
    :param codes: per categorical column, each row's index into ``values[column]`` (-1: missing).
    :param values: per categorical column, its distinct string values in this batch.
    :param source_codes: each row's index into ``sources`` (the source URIs).
    :param non_numeric: findings of non-numeric values in numeric columns (the slow pandas path).
    :param raw: per numeric column with non-numeric values, the raw text (for the error's samples).
    """

    numeric: np.ndarray
    codes: dict[str, np.ndarray]
    values: dict[str, list]
    source_codes: np.ndarray
    sources: list[str]
    non_numeric: dict[str, dict] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.numeric.shape[0]

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, uris, ctx: "BatchContext", non_numeric: dict | None = None) -> "Batch":
        """From a pandas frame of the used columns in canonical types (see :func:`normalise`)."""
        pd = _pandas()

        numeric = np.asfortranarray(frame[[*ctx.numeric, ctx.label]].to_numpy(dtype="float64"))
        codes, values = {}, {}
        for column in ctx.categorical:
            found, uniques = pd.factorize(frame[column].to_numpy(dtype=object), use_na_sentinel=True)
            codes[column], values[column] = found, [str(v) for v in uniques]
        source_codes, sources = pd.factorize(np.asarray(uris, dtype=object))
        return cls(numeric, codes, values, source_codes, list(sources), dict(non_numeric or {}))

    @classmethod
    def from_arrow(cls, table, ctx: "BatchContext", path: str | None = None) -> "Batch":
        """From a pyarrow batch; falls back to the pandas path for unusual column types.

        :param path: the file every row came from, where the table has no ``path`` column (the
            direct engine reads one file at a time; Ray Data adds the column).
        """
        import pyarrow as pa

        def plain_numeric(kind) -> bool:
            return (pa.types.is_floating(kind) or pa.types.is_integer(kind)) and not pa.types.is_boolean(kind)

        def plain_string(kind) -> bool:
            if pa.types.is_dictionary(kind):
                kind = kind.value_type
            return pa.types.is_string(kind) or pa.types.is_large_string(kind)

        numeric_ok = all(c in table.column_names and plain_numeric(table.schema.field(c).type)
                         for c in [*ctx.numeric, ctx.label])
        strings_ok = all(plain_string(table.schema.field(c).type) for c in ctx.categorical if c in table.column_names)
        rows = table.num_rows
        if not (numeric_ok and strings_ok):
            if path is not None and PATH_COLUMN not in table.column_names:
                table = table.append_column(PATH_COLUMN, pa.array([path] * rows, pa.string()))
            _pandas()
            frame, uris, non_numeric = normalise(table.to_pandas(), ctx)
            return cls.from_frame(frame, uris, ctx, non_numeric)
        if path is not None:
            source_codes, sources = np.zeros(rows, dtype="int32"), [ctx.source_of(path)]
        elif PATH_COLUMN in table.column_names:
            paths = table[PATH_COLUMN].combine_chunks().dictionary_encode()
            source_codes = paths.indices.to_numpy(zero_copy_only=False).astype("int32", copy=False)
            sources = [ctx.source_of(str(p)) for p in paths.dictionary.to_pylist()]
        else:
            source_codes, sources = np.zeros(rows, dtype="int32"), [""]
        numeric = np.empty((rows, len(ctx.numeric) + 1), dtype="float64", order="F")  # columns contiguous
        for index, column in enumerate([*ctx.numeric, ctx.label]):
            found = table[column]
            numeric[:, index] = _float_numpy(found if found.type == pa.float64() else found.cast(pa.float64()))
        codes, values = {}, {}
        for column in ctx.categorical:
            if column in table.column_names:
                found = table[column]
                if not pa.types.is_dictionary(found.type):
                    found = pa.chunked_array([found.combine_chunks().dictionary_encode()])
                codes[column], values[column] = _dictionary_codes(found)
            else:  # derived from the file name
                per_source = [ctx.derived.get(uri, {}).get(column) for uri in sources]
                distinct = sorted({v for v in per_source if v is not None})
                lookup = np.array([distinct.index(v) if v is not None else -1 for v in per_source] + [-1], dtype="int32")
                codes[column], values[column] = lookup[source_codes], distinct
        return cls(numeric, codes, values, source_codes, sources)

    def uri(self, row: int) -> str:
        return self.sources[self.source_codes[row]]

    def record(self, row: int, ctx: "BatchContext") -> dict[str, Any]:
        """One row as the used columns in canonical types, in ``ctx.plan.used`` order."""
        out: dict[str, Any] = {}
        for index, column in enumerate(ctx.numeric):
            out[column] = self.numeric[row, index]
        for column in ctx.categorical:
            code = self.codes[column][row]
            out[column] = None if code < 0 else self.values[column][code]
        out[ctx.label] = self.numeric[row, -1]
        return out

    def finding(self, mask: np.ndarray, ctx: "BatchContext") -> dict[str, Any]:
        """Count of the rows in ``mask`` per file, with a few of them as records."""
        indexes = np.flatnonzero(mask)
        per_source = np.bincount(self.source_codes[indexes], minlength=len(self.sources))
        files: dict[str, int] = {}
        for code in np.flatnonzero(per_source):
            files[self.sources[code]] = files.get(self.sources[code], 0) + int(per_source[code])
        samples = [{"file": self.uri(i), **{k: _jsonable(v) for k, v in self.record(i, ctx).items()}}
                   for i in indexes[:SAMPLE_ROWS]]
        return {"count": int(len(indexes)), "files": files, "samples": samples}

    def splits(self, keep: np.ndarray, ctx: "BatchContext") -> np.ndarray:
        """Split index of each kept row (the same hash as :func:`assign_splits` on a pandas frame)."""
        if not keep.any():
            return np.zeros(0, dtype="int8")
        positions = {column: index for index, column in enumerate(ctx.numeric)}
        positions[ctx.label] = len(ctx.numeric)
        every = bool(keep.all())
        canonical = {}
        for column in ctx.plan.hashed:
            if column in positions:
                values = self.numeric[:, positions[column]]
                canonical[column] = values if every else values[keep]
            else:
                codes = self.codes[column] if every else self.codes[column][keep]
                canonical[column] = (codes, self.values[column])
        return _split_of_hashes(_hash_columns(list(canonical.values()), ctx.seed), ctx.split)


def normalise(batch: pd.DataFrame, ctx: BatchContext) -> tuple[pd.DataFrame, list[str], dict[str, dict]]:
    """Return the used columns in canonical types, each row's source URI, and non-numeric findings.

    Numeric columns become float64 (non-numeric strings, possible in Parquet, become NaN and are
    reported); categorical columns become Python strings (missing: None).
    """
    pd = _pandas()

    paths = batch[PATH_COLUMN].astype(str) if PATH_COLUMN in batch.columns else pd.Series([""] * len(batch))
    uris = paths.map({p: ctx.source_of(p) for p in paths.unique()}).to_numpy(dtype=object)
    frame = pd.DataFrame(index=pd.RangeIndex(len(batch)))
    non_numeric: dict[str, dict] = {}
    for column in ctx.plan.used:
        if column in batch.columns:
            values = batch[column].reset_index(drop=True)
        else:  # derived from the file name
            values = pd.Series([ctx.derived.get(uri, {}).get(column) for uri in uris], dtype=object)
        if column in ctx.categorical:
            raw = values.astype(object)
            frame[column] = raw.where(raw.notna(), None).map(lambda v: v if v is None else str(v))
            continue
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            frame[column] = values.to_numpy(dtype="float64", na_value=np.nan)
            continue
        text = values.astype(object)
        numbers = pd.to_numeric(text, errors="coerce")
        bad = numbers.isna().to_numpy() & text.notna().to_numpy() & ~text.astype(str).str.strip().isin(NULL_TOKENS).to_numpy()
        if bad.any():
            non_numeric[column] = _finding(frame.assign(**{column: text}), uris, bad)
        frame[column] = numbers.to_numpy(dtype="float64", na_value=np.nan)
    return frame, list(uris), non_numeric


def _finding(frame: pd.DataFrame, uris, mask: np.ndarray) -> dict[str, Any]:
    """Count of the rows in ``mask`` per file, with a few of them as records."""
    indexes = np.flatnonzero(mask)
    files: dict[str, int] = {}
    for index in indexes:
        files[uris[index]] = files.get(uris[index], 0) + 1
    samples = [{"file": uris[i], **{k: _jsonable(v) for k, v in frame.iloc[i].items()}} for i in indexes[:SAMPLE_ROWS]]
    return {"count": int(len(indexes)), "files": files, "samples": samples}


def _jsonable(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if np.isfinite(value) else str(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value if isinstance(value, (str, int, bool)) else str(value)


def _merge_finding(into: dict[str, dict], found: dict[str, dict]) -> None:
    for column, finding in found.items():
        current = into.setdefault(column, {"count": 0, "files": {}, "samples": []})
        current["count"] += finding["count"]
        for uri, count in finding["files"].items():
            current["files"][uri] = current["files"].get(uri, 0) + count
        current["samples"] = (current["samples"] + finding["samples"])[:SAMPLE_ROWS]


def clean_batch(batch: Batch, ctx: BatchContext) -> tuple[np.ndarray, dict[str, dict], dict]:
    """Rows to keep, NaN/infinite/missing findings per column, and labels-out-of-range findings."""
    finite = np.isfinite(batch.numeric)
    bad_any = ~finite.all(axis=1)
    non_finite: dict[str, dict] = {}
    if bad_any.any():
        for index, column in enumerate([*ctx.numeric, ctx.label]):
            bad = ~finite[:, index]
            if bad.any():
                non_finite[column] = batch.finding(bad, ctx)
    for column in ctx.categorical:
        bad = batch.codes[column] < 0
        if bad.any():
            non_finite[column] = batch.finding(bad, ctx)
            bad_any |= bad
    out_of_range: dict[str, dict] = {}
    if ctx.label_range is not None:
        label = batch.numeric[:, -1]
        with np.errstate(invalid="ignore"):
            outside = finite[:, -1] & ((label < ctx.label_range[0]) | (label > ctx.label_range[1]))
        if outside.any():
            out_of_range[ctx.label] = batch.finding(outside, ctx)
    return ~bad_any, non_finite, out_of_range


def clean(frame: pd.DataFrame, uris: list[str], ctx: BatchContext) -> tuple[np.ndarray, dict[str, dict], dict]:
    """:func:`clean_batch` for a pandas frame of the used columns in canonical types."""
    return clean_batch(Batch.from_frame(frame, uris, ctx), ctx)


def summarise_batch(batch: Batch, ctx: BatchContext) -> dict[str, Any]:
    """The mergeable summary of one batch: findings, and per split counts and moments."""
    return summarise_and_split(batch, ctx)[0]


def take_rows(numeric: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``numeric[rows]`` (a boolean mask or indices) in column-major order, gathered column by column.

    ``numeric[mask]`` returns row-major data, on which the per-column reductions that follow (mean,
    min, max, the scaler) run about 3x slower; this gather costs the same as that copy.
    """
    index = np.flatnonzero(rows) if rows.dtype == bool else rows
    out = np.empty((len(index), numeric.shape[1]), dtype=numeric.dtype, order="F")
    for column in range(numeric.shape[1]):
        np.take(numeric[:, column], index, out=out[:, column])
    return out


def summarise_and_split(batch: Batch, ctx: BatchContext) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """:func:`summarise_batch`, the rows kept, and each kept row's split index."""
    keep, non_finite, out_of_range = clean_batch(batch, ctx)
    numeric = take_rows(batch.numeric, keep) if not keep.all() else batch.numeric
    splits = batch.splits(keep, ctx)
    label = numeric[:, -1]
    integral = bool(np.all(label == np.round(label)))
    summary: dict[str, Any] = {
        "rows": len(batch), "kept": int(keep.sum()), "non_numeric": batch.non_numeric,
        "non_finite": non_finite, "label_out_of_range": out_of_range, "label_integral": integral, "splits": {},
    }
    codes = {column: batch.codes[column][keep] for column in ctx.categorical}
    for index, name in enumerate(SPLITS):
        mask = splits == index
        part = take_rows(numeric, mask)
        categories = {}
        for column in ctx.categorical:
            counts = np.bincount(codes[column][mask], minlength=len(batch.values[column]))
            categories[column] = {str(batch.values[column][i]): int(counts[i]) for i in np.flatnonzero(counts)}
        labels = {}
        if integral:
            found, counts = np.unique(part[:, -1], return_counts=True)
            labels = {_label_key(k): int(v) for k, v in zip(found, counts)}
        summary["splits"][name] = {"rows": int(mask.sum()), "moments": Moments.of(part).to_dict(),
                                   "categories": categories, "labels": labels}
    return summary, keep, splits


def summarise(frame: pd.DataFrame, uris: list[str], ctx: BatchContext, non_numeric: dict) -> dict[str, Any]:
    """:func:`summarise_batch` for a pandas frame of the used columns in canonical types."""
    return summarise_batch(Batch.from_frame(frame, uris, ctx, non_numeric), ctx)


def _label_key(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def merge_summaries(summaries: Iterable[dict[str, Any]], width: int) -> dict[str, Any]:
    total: dict[str, Any] = {
        "rows": 0, "kept": 0, "non_numeric": {}, "non_finite": {}, "label_out_of_range": {}, "label_integral": True,
        "splits": {name: {"rows": 0, "moments": Moments.empty(width), "categories": {}, "labels": {}} for name in SPLITS},
    }
    for summary in summaries:
        total["rows"] += summary["rows"]
        total["kept"] += summary["kept"]
        for key in ("non_numeric", "non_finite", "label_out_of_range"):
            _merge_finding(total[key], summary[key])
        total["label_integral"] &= summary["label_integral"]
        for name in SPLITS:
            into, part = total["splits"][name], summary["splits"][name]
            into["rows"] += part["rows"]
            into["moments"] = into["moments"].merge(Moments.from_dict(part["moments"]))
            for column, counts in part["categories"].items():
                target = into["categories"].setdefault(column, {})
                for value, count in counts.items():
                    target[value] = target.get(value, 0) + count
            for value, count in part["labels"].items():
                into["labels"][value] = into["labels"].get(value, 0) + count
    return total


def raise_findings(total: dict[str, Any], ctx: BatchContext) -> None:
    """Raise the first failed check with the file, the column and sample rows."""
    def describe(finding: dict) -> str:
        files = ", ".join(f"{uri!r} ({count} rows)" for uri, count in sorted(finding["files"].items()))
        return f"in {files}; sample rows: {json.dumps(finding['samples'])}"

    for column, finding in total["non_numeric"].items():
        raise DataSourceError(
            f"column {column!r} must be numeric but has {finding['count']} non-numeric value(s) {describe(finding)}. "
            f"Fix the values, or list {column!r} in categorical_columns if it is a category"
        )
    if total["non_finite"] and ctx.nan_policy == "fail":
        column, finding = next(iter(total["non_finite"].items()))
        others = sorted(set(total["non_finite"]) - {column})
        raise DataSourceError(
            f"column {column!r} has {finding['count']} NaN, infinite or missing value(s) {describe(finding)}"
            + (f"; columns {others} have some too" if others else "")
            + ". Clean the data, or set nan_policy='drop' to drop those rows and count them"
        )
    for column, finding in total["label_out_of_range"].items():
        raise DataSourceError(
            f"label column {column!r} has {finding['count']} value(s) outside label_range {ctx.label_range} "
            f"{describe(finding)}. Fix the labels or widen label_range"
        )
    if total["splits"]["train"]["rows"] == 0:
        raise DataSourceError(
            f"no training rows: {total['rows']} rows read, {total['rows'] - total['kept']} dropped, "
            f"split {ctx.split}. Give more data or a larger train fraction"
        )


def transform_batch(batch: Batch, ctx: BatchContext, preprocessor: Preprocessor, label_integral: bool):
    """The rows of one batch as written (a pyarrow table): model inputs, the label and the split name."""
    import pyarrow as pa

    keep, _, _ = clean_batch(batch, ctx)
    numeric = batch.numeric[keep] if not keep.all() else batch.numeric
    codes = {column: batch.codes[column][keep] for column in ctx.categorical}
    columns = output_columns(numeric, codes, batch.values, ctx, preprocessor, label_integral)
    split = batch.splits(keep, ctx)
    columns[SPLIT_COLUMN] = pa.DictionaryArray.from_arrays(pa.array(split, pa.int8()), pa.array(SPLITS)).cast(pa.string())
    return pa.table(columns)


def output_columns(numeric: np.ndarray, codes: dict[str, np.ndarray], values: dict[str, list], ctx: BatchContext,
                   preprocessor: Preprocessor, label_integral: bool) -> dict[str, np.ndarray]:
    """The written columns (model inputs, then the label) of rows given in canonical arrays."""
    matrix = preprocessor.transform_arrays(numeric[:, :-1], {column: (codes[column], values[column])
                                                             for column in ctx.categorical})
    columns = {name: matrix[:, index] for index, name in enumerate(preprocessor.output_columns)}
    label = numeric[:, -1]
    columns[ctx.label] = label.astype("int64") if label_integral else label
    return columns


def transform(frame: pd.DataFrame, uris: list[str], ctx: BatchContext, preprocessor: Preprocessor,
              label_integral: bool) -> pd.DataFrame:
    """:func:`transform_batch` for a pandas frame of the used columns in canonical types."""
    return transform_batch(Batch.from_frame(frame, uris, ctx), ctx, preprocessor, label_integral).to_pandas()


def _summarise_batch(batch, ctx: BatchContext) -> dict[str, list]:
    return {"summary": [json.dumps(summarise_batch(Batch.from_arrow(batch, ctx), ctx))]}


def _transform_batch(batch, ctx: BatchContext, preprocessor: dict, label_integral: bool):
    return transform_batch(Batch.from_arrow(batch, ctx), ctx, Preprocessor.from_dict(preprocessor), label_integral)


# -- the direct engine: pyarrow in the job's driver ----------------------------------------------

CSV_BLOCK_BYTES = 1 << 20  # pyarrow's streaming CSV reader parses blocks of this size in parallel


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _csv_options(layout: SourceLayout, plan: ColumnPlan):
    """pyarrow's parse and convert options for one CSV source: the used columns, typed."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    used = [c for c in layout.columns if c in plan.used]
    types = {c: (pa.dictionary(pa.int32(), pa.string()) if c in plan.categorical else pa.float64()) for c in used}
    return (pacsv.ParseOptions(delimiter=layout.delimiter),
            pacsv.ConvertOptions(column_types=types, include_columns=used))


def iter_source_tables(layout: SourceLayout, plan: ColumnPlan, batch_rows: int = BATCH_ROWS):
    """Stream one source as pyarrow tables of about ``batch_rows`` rows (its used columns only).

    Nothing but the current batch is held: CSV is read with pyarrow's streaming reader (blocks
    parsed on all cores), Parquet one record batch at a time.
    """
    import pyarrow as pa

    filesystem, inner = _open(layout.path)
    if layout.file_format == "parquet":
        import pyarrow.parquet as pq

        used = [c for c in layout.columns if c in plan.used]
        with filesystem.open_input_file(inner) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=used):
                yield pa.Table.from_batches([batch])
        return
    import pyarrow.csv as pacsv

    parse, convert = _csv_options(layout, plan)
    with filesystem.open_input_stream(inner) as stream:
        reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(use_threads=True, block_size=CSV_BLOCK_BYTES),
                                parse_options=parse, convert_options=convert)
        pending, rows = [], 0
        for batch in reader:
            pending.append(batch)
            rows += batch.num_rows
            if rows >= batch_rows:
                yield pa.Table.from_batches(pending)
                pending, rows = [], 0
        if pending:
            yield pa.Table.from_batches(pending)


def _in_order(function, items: Iterable, workers: int):
    """``function`` over ``items`` on ``workers`` threads, results in input order, few in flight.

    At most ``workers + 1`` items are taken ahead of the results consumed, so memory stays bounded
    whatever the input size (``Executor.map`` would take every item at once). numpy and pyarrow
    release the GIL in the heavy steps, so the threads use several cores.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayml-data") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _scratch_table(batch: Batch, keep: np.ndarray, splits: np.ndarray, ctx: BatchContext):
    """The kept rows of a batch as pass 2 needs them: canonical values and their split index."""
    import pyarrow as pa

    every = bool(keep.all())
    numeric = batch.numeric if every else batch.numeric[keep]
    columns = {f"n{index}": numeric[:, index] for index in range(numeric.shape[1])}
    for position, column in enumerate(ctx.categorical):
        codes = batch.codes[column] if every else batch.codes[column][keep]
        columns[f"c{position}"] = pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32(), mask=codes < 0), pa.array(batch.values[column], pa.string()))
    columns[SPLIT_COLUMN] = splits
    return pa.table(columns)


def _from_scratch(table, ctx: BatchContext) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list], np.ndarray]:
    width = len(ctx.numeric) + 1
    numeric = np.empty((table.num_rows, width), dtype="float64", order="F")
    for index in range(width):
        numeric[:, index] = _float_numpy(table[f"n{index}"])
    codes, values = {}, {}
    for position, column in enumerate(ctx.categorical):
        codes[column], values[column] = _dictionary_codes(table[f"c{position}"])
    return numeric, codes, values, _joined([chunk.to_numpy() for chunk in table[SPLIT_COLUMN].chunks], "int8")


def profile_direct(layouts: list[SourceLayout], ctx: BatchContext, scratch: str, workers: int) -> dict[str, Any]:
    """Pass 1 in the driver: check and summarise every batch; keep the canonical rows in ``scratch``.

    The scratch files (Arrow IPC, one per batch, on the driver's local disk) spare pass 2 the CSV
    parse and the split hash; they are removed with the scratch directory whatever happens.
    """
    import pyarrow as pa

    plan = ctx.plan

    def tables():
        number = 0
        for layout in layouts:
            for table in iter_source_tables(layout, plan):
                yield number, layout.path, table
                number += 1

    def profile(item) -> dict[str, Any]:
        number, path, table = item
        batch = Batch.from_arrow(table, ctx, path=path)
        summary, keep, splits = summarise_and_split(batch, ctx)
        part = _scratch_table(batch, keep, splits, ctx)
        with pa.OSFile(os.path.join(scratch, f"batch-{number:08d}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, part.schema) as writer:
                writer.write_table(part)
        return summary

    return merge_summaries(_in_order(profile, tables(), workers), len(ctx.numeric) + 1)


def write_direct(splits_dir: str, scratch: str, ctx: BatchContext, preprocessor: Preprocessor, label_integral: bool,
                 workers: int) -> None:
    """Pass 2 in the driver: transform the scratch batches and append them to one Parquet file per split.

    Each batch becomes one row group per split, so memory stays bounded by the batch size.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem, root = artifacts.resolve(splits_dir)
    files = sorted(name for name in os.listdir(scratch) if name.startswith("batch-"))

    def transform_file(name: str) -> list:
        with pa.memory_map(os.path.join(scratch, name)) as source:
            table = pa.ipc.open_file(source).read_all()
        numeric, codes, values, split = _from_scratch(table, ctx)
        del table
        os.remove(os.path.join(scratch, name))
        parts = []
        for index in range(len(SPLITS)):
            rows = np.flatnonzero(split == index)
            if len(rows):
                columns = output_columns(numeric[rows], {c: v[rows] for c, v in codes.items()}, values, ctx,
                                         preprocessor, label_integral)
                parts.append((index, pa.table(columns)))
        return parts

    writers: dict[int, Any] = {}
    try:
        for parts in _in_order(transform_file, files, workers):
            for index, table in parts:
                if index not in writers:
                    folder = f"{root}/{SPLIT_COLUMN}={SPLITS[index]}"
                    filesystem.create_dir(folder, recursive=True)
                    writers[index] = pq.ParquetWriter(f"{folder}/part-00000.parquet", table.schema,
                                                      filesystem=filesystem)
                writers[index].write_table(table)
    finally:
        for writer in writers.values():
            writer.close()


def choose_engine(spec: PreprocessSpec, layouts: list[SourceLayout]) -> tuple[str, str]:
    """``direct`` or ``ray_data``, and why.

    The direct engine skips Ray Data's start-up (worker processes that import it, two executions:
    ~2.5 s on a 2-CPU machine, more than the whole work at 650 k rows) and uses every core of the
    driver's node; Ray Data pays off only where other nodes add CPUs.
    """
    if spec.engine != "auto":
        return spec.engine, f"engine={spec.engine!r} set in the spec"
    size = sum(layout.size for layout in layouts)
    if size <= spec.direct_max_bytes:
        return "direct", (f"{size:,} input bytes <= direct_max_bytes={spec.direct_max_bytes:,}: pyarrow in the "
                          f"job's driver on {_cores()} core(s), no Ray Data start-up")
    _connect()
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes <= 1:
        return "direct", (f"{size:,} input bytes, but the cluster has one node: pyarrow in the job's driver on "
                          f"{_cores()} core(s) does the same work without Ray Data's start-up")
    return "ray_data", f"{size:,} input bytes > direct_max_bytes and {nodes} nodes: Ray Data tasks across the cluster"


# -- Ray Data ------------------------------------------------------------------------------------

def _connect() -> None:
    _pandas()  # Ray Data works in pandas
    import ray

    if not ray.is_initialized():
        ray.init(logging_level=logging.WARNING, log_to_driver=False)  # RAY_ADDRESS in a job
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False


def read_dataset(layouts: list[SourceLayout], plan: ColumnPlan, spec: PreprocessSpec):
    """One Ray Dataset over every source, with only the used columns and a ``path`` column."""
    import ray.data

    groups: dict[tuple, list[str]] = {}
    sizes: dict[tuple, int] = {}
    for layout in layouts:
        key = (layout.file_format, layout.delimiter, tuple(layout.columns))
        groups.setdefault(key, []).append(layout.path)
        sizes[key] = sizes.get(key, 0) + layout.size
    datasets = []
    for (file_format, delimiter, columns), paths in groups.items():
        used = [c for c in columns if c in plan.used]
        # One block per file by default: Ray's default splits a file's output into many ~1 MiB
        # blocks (38 for a 40 MB CSV on 2 CPUs), which stops the read from fusing with the map and
        # pays a task per block; one fused read->map(->write) task per file is 2x faster (measured,
        # README "Preprocessing"). A fused write task holds its whole output until it writes, so
        # files larger than MAX_FILE_BLOCK_BYTES on average are split into more blocks (unfused).
        blocks = spec.override_num_blocks or max(len(paths), -(-sizes[(file_format, delimiter, columns)]
                                                                // MAX_FILE_BLOCK_BYTES))
        if file_format == "csv":
            layout = next(l for l in layouts if (l.file_format, l.delimiter, tuple(l.columns)) == (file_format, delimiter, columns))
            parse, convert = _csv_options(layout, plan)
            datasets.append(ray.data.read_csv(
                paths, include_paths=True, partitioning=None, override_num_blocks=blocks,
                parse_options=parse, convert_options=convert,
            ))
        else:
            datasets.append(ray.data.read_parquet(
                paths, columns=used, include_paths=True, partitioning=None,
                override_num_blocks=blocks,
            ))
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def diagnose_csv(layouts: list[SourceLayout], plan: ColumnPlan, chunk_rows: int = 200_000) -> None:
    """After the typed read failed: find the non-numeric values, streaming each file with pandas."""
    pd = _pandas()

    for layout in layouts:
        if layout.file_format != "csv":
            continue
        numeric = [c for c in layout.columns if c in plan.numeric or c == plan.label]
        filesystem, inner = _open(layout.path)
        with filesystem.open_input_stream(inner) as stream:
            chunks = pd.read_csv(stream, sep=layout.delimiter, dtype=str, keep_default_na=False,
                                 chunksize=chunk_rows, encoding="utf-8-sig")
            for number, chunk in enumerate(chunks):
                for column in numeric:
                    text = chunk[column]
                    bad = pd.to_numeric(text, errors="coerce").isna() & ~text.str.strip().isin(NULL_TOKENS)
                    if bad.any():
                        rows = chunk[bad].head(SAMPLE_ROWS)
                        samples = [{"line": int(number * chunk_rows + index + 2), **row}
                                   for index, row in zip(rows.index - chunk.index[0], rows.to_dict("records"))]
                        raise DataSourceError(
                            f"column {column!r} must be numeric but {layout.uri!r} has non-numeric value(s) "
                            f"{sorted(set(text[bad].head(10)))}; sample rows: {json.dumps(samples)}. Fix the values, "
                            f"or list {column!r} in categorical_columns if it is a category"
                        )


def _fingerprint(layouts: list[SourceLayout], out: dict[str, str]) -> None:
    """sha256 over the files' bytes in source order (what ``generate`` reports for its files)."""
    digest = hashlib.sha256()
    for layout in layouts:
        filesystem, inner = _open(layout.path)
        with filesystem.open_input_stream(inner) as stream:
            while chunk := stream.read(HASH_CHUNK):
                digest.update(chunk)
    out["fingerprint"] = "sha256:" + digest.hexdigest()


def _stats(moments: Moments, columns: list[str]) -> dict[str, dict[str, float | None]]:
    std = moments.std
    result = {}
    for index, column in enumerate(columns):
        if moments.count == 0:
            result[column] = {"count": 0}
            continue
        result[column] = {"count": moments.count, "mean": float(moments.mean[index]), "std": float(std[index]),
                          "min": float(moments.minimum[index]), "max": float(moments.maximum[index])}
    return result


def build_profile(total: dict[str, Any], plan: ColumnPlan, spec: PreprocessSpec, layouts: list[SourceLayout],
                  fingerprint: str) -> dict[str, Any]:
    columns = [*plan.numeric, plan.label]
    overall = Moments.empty(len(columns))
    for name in SPLITS:
        overall = overall.merge(total["splits"][name]["moments"])
    return {
        "fingerprint": fingerprint,
        "sources": [{"uri": l.uri, "format": l.file_format, "delimiter": l.delimiter, "columns": l.all_columns}
                    for l in layouts],
        "rows": {"read": total["rows"], "dropped": total["rows"] - total["kept"],
                 **{name: total["splits"][name]["rows"] for name in SPLITS}},
        "dropped_by_column": {c: f["count"] for c, f in total["non_finite"].items()},
        "split": {"fractions": spec.split, "seed": spec.seed,
                  "method": "seeded hash of each row's used values (sorted column order)"},
        "columns": _stats(overall, columns),
        "columns_by_split": {name: _stats(total["splits"][name]["moments"], columns) for name in SPLITS},
        "categories": {c: {name: total["splits"][name]["categories"].get(c, {}) for name in SPLITS}
                       for c in plan.categorical},
        "label": {"column": plan.label, "integral": total["label_integral"],
                  "distribution": ({name: dict(sorted(total["splits"][name]["labels"].items(), key=lambda kv: float(kv[0])))
                                    for name in SPLITS} if total["label_integral"] else None)},
    }


def run_preprocess(spec: PreprocessSpec) -> PreprocessResult:
    """Validate, split, fit and write everything ``spec`` asks for; return what was written."""
    scratch = tempfile.mkdtemp(prefix="rayml-data-")
    try:
        with pandas_deferred():
            return _run(spec, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(spec: PreprocessSpec, scratch: str) -> PreprocessResult:
    layouts = []
    for uri in spec.source:
        path = _download(uri, scratch) if uri.startswith(("http://", "https://")) else _reader_path(uri)
        layouts.append(inspect_source(uri, path, spec))
    plan = plan_columns(layouts, spec)
    log.info("sources %s: numeric %s, categorical %s, label %r", spec.source, plan.numeric, plan.categorical, plan.label)
    ctx = BatchContext(plan.numeric, plan.categorical, plan.label, list(spec.split), spec.seed, spec.nan_policy,
                       spec.label_range, {l.path: l.uri for l in layouts}, {l.uri: l.derived for l in layouts})

    fingerprint: dict[str, str] = {}
    hasher = threading.Thread(target=_fingerprint, args=(layouts, fingerprint), daemon=True)
    hasher.start()
    engine, engine_reason = choose_engine(spec, layouts)
    log.info("engine %s: %s", engine, engine_reason)
    workers = _cores()
    rows_dir = os.path.join(scratch, "rows")
    os.makedirs(rows_dir)
    dataset = None
    started = time.perf_counter()
    try:
        if engine == "direct":
            total = profile_direct(layouts, ctx, rows_dir, workers)
        else:
            _connect()
            dataset = read_dataset(layouts, plan, spec)
            rows = dataset.map_batches(_summarise_batch, batch_format="pyarrow", batch_size=BATCH_ROWS,
                                       fn_kwargs={"ctx": ctx}).take_all()
            total = merge_summaries((json.loads(row["summary"]) for row in rows), len(plan.numeric) + 1)
    except DataSourceError:
        raise
    except Exception:
        # The typed CSV read fails on the first non-numeric value with a message naming neither
        # the row nor (reliably) the column: find them, or re-raise the original error.
        diagnose_csv(layouts, plan)
        raise
    log.info("pass 1 (validate, split, summarise) over %d rows in %.2f s", total["rows"], time.perf_counter() - started)
    raise_findings(total, ctx)
    dropped = total["rows"] - total["kept"]
    if dropped:
        log.warning("dropped %d of %d rows with NaN, infinite or missing values: %s", dropped, total["rows"],
                    {c: f["count"] for c, f in total["non_finite"].items()})

    train = total["splits"]["train"]
    categories = {}
    for column in plan.categorical:
        values = sorted(train["categories"].get(column, {}))
        if len(values) > spec.max_categories:
            raise DataSourceError(
                f"categorical column {column!r} has {len(values)} distinct training values (more than "
                f"max_categories={spec.max_categories}), e.g. {values[:5]}: drop it or raise max_categories"
            )
        categories[column] = values
    width = len(plan.numeric)
    train_moments = Moments(train["moments"].count, train["moments"].mean[:width], train["moments"].m2[:width],
                            train["moments"].minimum[:width], train["moments"].maximum[:width])
    preprocessor = Preprocessor.fit(spec.scaler, plan.numeric, train_moments, categories, plan.label)
    hasher.join()

    # Everything is valid: now write.
    started = time.perf_counter()
    splits_dir = artifacts.join(spec.artifact_dir, "splits")
    artifacts.makedirs(spec.artifact_dir)
    if engine == "direct":
        write_direct(splits_dir, rows_dir, ctx, preprocessor, total["label_integral"], workers)
    else:
        output = dataset.map_batches(
            _transform_batch, batch_format="pyarrow", batch_size=BATCH_ROWS,
            fn_kwargs={"ctx": ctx, "preprocessor": preprocessor.to_dict(), "label_integral": total["label_integral"]},
        )
        output.write_parquet(_ray_uri(splits_dir), partition_cols=[SPLIT_COLUMN])
    log.info("pass 2 (transform, write) in %.2f s", time.perf_counter() - started)
    preprocessor_uri = artifacts.join(spec.artifact_dir, "preprocessor.json")
    artifacts.write_bytes_atomic(preprocessor_uri, preprocessor.to_json().encode("utf-8"))
    # Every scaler fitted on the same training statistics (the moments hold all of them): a tuning
    # trial or the train stage maps the written splits to another scaler exactly, without a refit.
    variants = {}
    for scaler in SCALERS:
        variant = Preprocessor.fit(scaler, plan.numeric, train_moments, categories, plan.label)
        variants[scaler] = artifacts.join(spec.artifact_dir, "preprocessors", f"{scaler}.json")
        artifacts.write_bytes_atomic(variants[scaler], variant.to_json().encode("utf-8"))
    profile_uri = artifacts.join(spec.artifact_dir, "profile.json")
    profile = build_profile(total, plan, spec, layouts, fingerprint.get("fingerprint", ""))
    profile["engine"] = {"name": engine, "reason": engine_reason}
    artifacts.write_json_atomic(profile_uri, profile)
    counts = {name: total["splits"][name]["rows"] for name in SPLITS}
    return PreprocessResult(
        split_uris={name: (artifacts.join(splits_dir, f"{SPLIT_COLUMN}={name}") if counts[name] else None)
                    for name in SPLITS},
        preprocessor_uri=preprocessor_uri,
        profile_uri=profile_uri,
        rows=counts,
        rows_read=total["rows"],
        rows_dropped=dropped,
        feature_columns=preprocessor.output_columns,
        label_column=plan.label,
        fingerprint=fingerprint.get("fingerprint", ""),
        preprocessor_variants=variants,
    )


def _ray_uri(uri: str) -> str:
    return uri if artifacts.is_remote(uri) else _reader_path(uri)


def main(argv: list[str] | None = None) -> int:
    return run_stage(PreprocessSpec, run_preprocess, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
