"""One batch in canonical types: what every per-batch step (check, summarise, transform) works on.

:class:`Batch` holds a batch's numeric columns as one float64 matrix and its categorical columns
as codes into their values, built from a pyarrow table (both engines) or a pandas frame (the slow
path for unusual column types); :class:`BatchContext` is what the per-batch functions need, shipped
as JSON-able fields to Ray tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from airflow_ray_ml_stages.constants import is_missing
from airflow_ray_ml_stages.data.deferred_pandas import import_pandas
from airflow_ray_ml_stages.data.schema import NULL_TOKENS, ColumnPlan
from airflow_ray_ml_stages.data.sources import SAMPLE_ROWS
from airflow_ray_ml_stages.data.split import hash_columns, separate_copies, split_of_hashes
from airflow_ray_ml_stages.errors import quotable
from airflow_ray_ml_stages.preprocessor import boolean_numbers


PATH_COLUMN = "path"


@dataclass
class BatchContext:
    """What every batch function needs, as JSON-able fields shipped to the Ray tasks."""

    numeric: list[str]  # the float64 matrix's columns: the numeric features, then the boolean ones (as 1/0)
    categorical: list[str]
    label: str
    split: list[float]
    seed: int
    nan_policy: str
    label_range: list[float] | None
    sources: dict[str, str]  # the path Ray reports -> the source URI
    derived: dict[str, dict[str, str]]  # source URI -> {column: value}
    task: str = "regression"
    label_text: bool = False  # see ColumnPlan.label_text
    label_threshold: float | None = None
    max_categories: int = 100
    # Classification, set once pass 1 has seen every row: the classes in index order, and per
    # class (its key, see airflow_ray_ml_stages.data.labels) its cut points [train_end, validation_end].
    classes: list[Any] | None = None
    cuts: dict[str, list[int]] | None = None
    boolean: list[str] = field(default_factory=list)  # the boolean features: the last ones of ``numeric``

    @property
    def plan(self) -> ColumnPlan:
        return ColumnPlan([c for c in self.numeric if c not in self.boolean], self.categorical, self.label,
                          self.label_text, list(self.boolean))

    @property
    def stratified(self) -> bool:
        """A classification split: by class, at cut points known only after pass 1."""
        return self.task == "classification"

    def source_of(self, path: str) -> str:
        if path in self.sources:
            return self.sources[path]
        for known, uri in self.sources.items():  # stores differ in how they report paths
            if known.endswith(path) or path.endswith(known.split("://", 1)[-1]):
                return uri
        return path


def _codes_numpy(indices) -> np.ndarray:
    """A dictionary array's indices as int32 numpy codes, -1 where missing (without pyarrow.compute)."""
    if not indices.null_count:
        return indices.to_numpy(zero_copy_only=False).astype("int32", copy=False)
    found = indices.to_numpy(zero_copy_only=False)  # float64, NaN where missing
    return np.where(np.isnan(found), -1, found).astype("int32")


def joined(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    """Per-chunk arrays as one array (no copy for a single chunk)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def float_numpy(column) -> np.ndarray:
    """A float64 chunked column as one numpy array, NaN where missing."""
    return joined([chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks], "float64")


def dictionary_codes(column) -> tuple[np.ndarray, list]:
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
    return joined(parts, "int32"), list(position)


def text_missing(codes: np.ndarray, values: list) -> np.ndarray:
    """A text column's codes with the missing tokens (``""``, ``NA``, ...) as missing (-1): empty text
    is a missing value, as in a numeric column, never a category of its own."""
    missing = np.array([is_missing(value) for value in values] + [True])
    if not missing[:-1].any():
        return codes
    return np.where(missing[codes], -1, codes).astype("int32", copy=False)


def text_label(codes: np.ndarray, values: list) -> tuple[np.ndarray, list, np.ndarray]:
    """A text label's codes and values with the missing tokens as missing (-1, :func:`text_missing`),
    and its slot in the numeric matrix: 0 where present, NaN where missing, so the missing-value
    checks (``nan_policy``) treat the label like any other column."""
    codes = text_missing(codes, values)
    return codes, values, np.where(codes < 0, np.nan, 0.0)


BAD_VALUES = 5  # a finding of values that are not booleans quotes at most this many of them
BAD_VALUE_CHARS = 40  # each cut to this length


def boolean_floats(values) -> tuple[np.ndarray, np.ndarray]:
    """A boolean column's values as 1.0/0.0 (NaN: missing, or not a boolean), and which are not booleans.

    The missing tokens (``""``, ``NA``, ...) are missing values, as in a numeric column.
    """
    numbers, invalid = boolean_numbers(values)
    if invalid.any():
        invalid &= ~np.array([is_missing(value) for value in values], dtype=bool)
    return numbers, invalid


def bad_values(values) -> list[str]:
    """A few distinct values that are not booleans, cut short, for an error message."""
    distinct = sorted({str(value) for value in values})
    return [value[:BAD_VALUE_CHARS] for value in distinct[:BAD_VALUES]]


@dataclass
class Batch:
    """One batch in canonical types, as arrays (what every per-batch step works on).

    :param numeric: float64 matrix, rows x (numeric columns, then the label); missing values NaN.
        A text label's column holds 0 where the label is present (see :func:`text_label`).
    :param codes: per categorical column, each row's index into ``values[column]`` (-1: missing).
    :param values: per categorical column, its distinct string values in this batch.
    :param source_codes: each row's index into ``sources`` (the source URIs).
    :param non_numeric: findings of non-numeric values in numeric columns (the slow pandas path), and
        of values that are not booleans in boolean columns (with ``values``: a few of them).
    :param label_codes: a text label only: each row's index into ``label_values`` (-1: missing).
    :param label_values: a text label only: its distinct values in this batch.
    """

    numeric: np.ndarray
    codes: dict[str, np.ndarray]
    values: dict[str, list]
    source_codes: np.ndarray
    sources: list[str]
    non_numeric: dict[str, dict] = field(default_factory=dict)
    label_codes: np.ndarray | None = None
    label_values: list | None = None

    def __len__(self) -> int:
        return self.numeric.shape[0]

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, uris, ctx: "BatchContext", non_numeric: dict | None = None) -> "Batch":
        """From a pandas frame of the used columns in canonical types (see :func:`normalise`)."""
        pd = import_pandas()

        if not ctx.label_text:
            numeric = np.asfortranarray(frame[[*ctx.numeric, ctx.label]].to_numpy(dtype="float64"))
        codes, values = {}, {}
        for column in [*ctx.categorical, *([ctx.label] if ctx.label_text else [])]:
            found, uniques = pd.factorize(frame[column].to_numpy(dtype=object), use_na_sentinel=True)
            values[column] = [str(v) for v in uniques]
            codes[column] = text_missing(found, values[column]) if column in ctx.categorical else found
        label_codes = label_values = None
        if ctx.label_text:
            label_codes, label_values, slot = text_label(codes.pop(ctx.label), values.pop(ctx.label))
            numeric = np.empty((len(frame), len(ctx.numeric) + 1), dtype="float64", order="F")
            numeric[:, :-1] = frame[ctx.numeric].to_numpy(dtype="float64")
            numeric[:, -1] = slot
        source_codes, sources = pd.factorize(np.asarray(uris, dtype=object))
        return cls(numeric, codes, values, source_codes, list(sources), dict(non_numeric or {}), label_codes,
                   label_values)

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

        texts = [*ctx.categorical, *([ctx.label] if ctx.label_text else [])]
        numbers = [c for c in ctx.numeric if c not in ctx.boolean]
        numeric_ok = all(c in table.column_names and plain_numeric(table.schema.field(c).type)
                         for c in [*numbers, *([] if ctx.label_text else [ctx.label])])
        numeric_ok = numeric_ok and all(c in table.column_names and (pa.types.is_boolean(table.schema.field(c).type)
                                                                     or plain_string(table.schema.field(c).type))
                                        for c in ctx.boolean)
        strings_ok = all(plain_string(table.schema.field(c).type) for c in texts if c in table.column_names)
        rows = table.num_rows
        if not (numeric_ok and strings_ok):
            if path is not None and PATH_COLUMN not in table.column_names:
                table = table.append_column(PATH_COLUMN, pa.array([path] * rows, pa.string()))
            import_pandas()
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
        not_boolean: dict[str, tuple[np.ndarray, list[str]]] = {}
        for index, column in enumerate([*ctx.numeric, *([] if ctx.label_text else [ctx.label])]):
            found = table[column]
            if column in ctx.boolean and not pa.types.is_boolean(found.type):
                if not pa.types.is_dictionary(found.type):
                    found = pa.chunked_array([found.combine_chunks().dictionary_encode()])
                codes, words = dictionary_codes(found)
                lookup, invalid = boolean_floats(words)
                numeric[:, index] = np.append(lookup, np.nan)[codes]  # -1 (missing) picks the trailing NaN
                if invalid.any():
                    not_boolean[column] = (np.append(invalid, False)[codes], bad_values(np.asarray(words)[invalid]))
                continue
            numeric[:, index] = float_numpy(found if found.type == pa.float64() else found.cast(pa.float64()))
        codes, values = {}, {}
        for column in texts:
            if column in table.column_names:
                found = table[column]
                if not pa.types.is_dictionary(found.type):
                    found = pa.chunked_array([found.combine_chunks().dictionary_encode()])
                codes[column], values[column] = dictionary_codes(found)
                if column in ctx.categorical:
                    codes[column] = text_missing(codes[column], values[column])
            else:  # derived from the file name
                per_source = [ctx.derived.get(uri, {}).get(column) for uri in sources]
                distinct = sorted({v for v in per_source if v is not None})
                lookup = np.array([distinct.index(v) if v is not None else -1 for v in per_source] + [-1], dtype="int32")
                codes[column], values[column] = lookup[source_codes], distinct
        label_codes = label_values = None
        if ctx.label_text:
            label_codes, label_values, numeric[:, -1] = text_label(codes.pop(ctx.label), values.pop(ctx.label))
        batch = cls(numeric, codes, values, source_codes, sources, label_codes=label_codes, label_values=label_values)
        for column, (mask, found) in not_boolean.items():
            batch.non_numeric[column] = {**batch.finding(mask, ctx), "values": found}
        return batch

    def uri(self, row: int) -> str:
        return self.sources[self.source_codes[row]]

    def record(self, row: int, ctx: "BatchContext") -> dict[str, Any]:
        """One row as the used columns in canonical types, in ``ctx.plan.used`` order."""
        out: dict[str, Any] = {}
        for index, column in enumerate(ctx.numeric):
            out[column] = self.numeric[row, index]
            if column in ctx.boolean:
                out[column] = None if np.isnan(out[column]) else bool(out[column])
        for column in ctx.categorical:
            code = self.codes[column][row]
            out[column] = None if code < 0 else self.values[column][code]
        if self.label_codes is None:
            out[ctx.label] = self.numeric[row, -1]
        else:
            code = self.label_codes[row]
            out[ctx.label] = None if code < 0 else self.label_values[code]
        return out

    def finding(self, mask: np.ndarray, ctx: "BatchContext") -> dict[str, Any]:
        """Count of the rows in ``mask`` per file, with a few of them as records."""
        indexes = np.flatnonzero(mask)
        per_source = np.bincount(self.source_codes[indexes], minlength=len(self.sources))
        files: dict[str, int] = {}
        for code in np.flatnonzero(per_source):
            files[self.sources[code]] = files.get(self.sources[code], 0) + int(per_source[code])
        samples = [{"file": self.uri(i), **quotable({k: _jsonable(v) for k, v in self.record(i, ctx).items()})}
                   for i in indexes[:SAMPLE_ROWS]]
        return {"count": int(len(indexes)), "files": files, "samples": samples}

    def splits(self, keep: np.ndarray, ctx: "BatchContext") -> np.ndarray:
        """Split index of each kept row (the same hash as :func:`assign_splits` on a pandas frame)."""
        return split_of_hashes(self.hashes(keep, ctx), ctx.split)

    def hashes(self, keep: np.ndarray, ctx: "BatchContext") -> np.ndarray:
        """The seeded 64-bit hash of each kept row's used values (sorted column order), each copy of a row
        in the batch hashed by itself (:func:`~airflow_ray_ml_stages.data.split.separate_copies`)."""
        if not keep.any():
            return np.zeros(0, dtype="uint64")
        positions = {column: index for index, column in enumerate(ctx.numeric)}
        if self.label_codes is None:
            positions[ctx.label] = len(ctx.numeric)
        every = bool(keep.all())
        canonical = {}
        for column in ctx.plan.hashed:
            if column in positions:
                values = self.numeric[:, positions[column]]
                canonical[column] = values if every else values[keep]
            else:
                codes, values = ((self.label_codes, self.label_values) if column == ctx.label
                                 else (self.codes[column], self.values[column]))
                canonical[column] = (codes if every else codes[keep], values)
        return separate_copies(hash_columns(list(canonical.values()), ctx.seed))

    def kept_label(self, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The kept rows' label: its numeric column, and a text label's codes (None for a numeric label)."""
        every = bool(keep.all())
        label = self.numeric[:, -1] if every else self.numeric[keep, -1]
        if self.label_codes is None:
            return label, None
        return label, self.label_codes if every else self.label_codes[keep]


def normalise(batch: pd.DataFrame, ctx: BatchContext) -> tuple[pd.DataFrame, list[str], dict[str, dict]]:
    """Return the used columns in canonical types, each row's source URI, and non-numeric findings.

    Numeric columns become float64 (non-numeric strings, possible in Parquet, become NaN and are
    reported), boolean columns 1.0/0.0 (others NaN, reported); categorical columns become Python
    strings (missing: None).
    """
    pd = import_pandas()

    paths = batch[PATH_COLUMN].astype(str) if PATH_COLUMN in batch.columns else pd.Series([""] * len(batch))
    uris = paths.map({p: ctx.source_of(p) for p in paths.unique()}).to_numpy(dtype=object)
    frame = pd.DataFrame(index=pd.RangeIndex(len(batch)))
    non_numeric: dict[str, dict] = {}
    for column in ctx.plan.used:
        if column in batch.columns:
            values = batch[column].reset_index(drop=True)
        else:  # derived from the file name
            values = pd.Series([ctx.derived.get(uri, {}).get(column) for uri in uris], dtype=object)
        if column in ctx.categorical or (ctx.label_text and column == ctx.label):
            raw = values.astype(object)
            frame[column] = raw.where(raw.notna(), None).map(lambda v: v if v is None else str(v))
            continue
        if column in ctx.boolean:
            text = values.astype(object)
            numbers, invalid = boolean_floats(text.where(text.notna(), None).to_numpy(dtype=object))
            if invalid.any():
                non_numeric[column] = {**_finding(frame.assign(**{column: text}), uris, invalid),
                                       "values": bad_values(text[invalid])}
            frame[column] = numbers
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
    samples = [{"file": uris[i], **quotable({k: _jsonable(v) for k, v in frame.iloc[i].items()})}
               for i in indexes[:SAMPLE_ROWS]]
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
