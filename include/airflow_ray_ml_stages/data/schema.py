"""Which columns are what: the files' columns checked against each other and the spec, and planned.

:func:`plan_columns` raises on files that do not share one schema, a missing label or feature
column, or an unexpected column, and decides which features are numeric, boolean and categorical
and whether a classification label is read as text (:class:`ColumnPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_ray_ml_stages.data.sources import SourceLayout, filesystem_of
from airflow_ray_ml_stages.errors import DataSourceError, quotable
from airflow_ray_ml_stages.preprocessor import BOOLEAN_WORDS
from airflow_ray_ml_stages.specs import PreprocessSpec


from airflow_ray_ml_stages.constants import NULL_TOKENS  # noqa: F401  (the data stage's missing values)


@dataclass
class ColumnPlan:
    """The used columns by kind.

    :param label_text: the label is read as text (a classification label whose values are not
        numbers: each distinct string a class); otherwise as float64 like the numeric columns.
    :param boolean: features of booleans (true/false or yes/no, any case; or a Parquet boolean
        column): read as text (a CSV) and carried as 1.0/0.0 after the numeric columns.
    """

    numeric: list[str]
    categorical: list[str]
    label: str
    label_text: bool = False
    boolean: list[str] = field(default_factory=list)

    @property
    def features(self) -> list[str]:
        return [*self.numeric, *self.boolean, *self.categorical]

    @property
    def used(self) -> list[str]:
        return [*self.features, self.label]

    @property
    def hashed(self) -> list[str]:
        """The columns whose values decide a row's split, in a fixed order."""
        return sorted(self.used)


def _parquet_type(layout: SourceLayout, column: str):
    """The Arrow type of ``column`` in a Parquet source's schema."""
    import pyarrow.parquet as pq

    filesystem, inner = filesystem_of(layout.path)
    with filesystem.open_input_file(inner) as handle:
        return pq.ParquetFile(handle).schema_arrow.field(column).type


def _looks_categorical(layout: SourceLayout, column: str) -> bool:
    """True when every non-empty value of ``column`` in the file's first rows is non-numeric."""
    if column in layout.derived:
        return True
    if layout.file_format == "parquet":
        import pyarrow as pa

        kind = _parquet_type(layout, column)
        return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind)
    values = _head_values(layout, column)
    return bool(values) and not any(_is_number(value) for value in values)


def _looks_boolean(layout: SourceLayout, column: str) -> bool:
    """True for a Parquet boolean column, or one whose first non-empty values are all boolean words."""
    if column in layout.derived:
        return False
    if layout.file_format == "parquet":
        import pyarrow as pa

        if pa.types.is_boolean(_parquet_type(layout, column)):
            return True
        if not _looks_categorical(layout, column):
            return False
    values = _head_values(layout, column)
    return bool(values) and all(value.lower() in BOOLEAN_WORDS for value in values)


def _head_values(layout: SourceLayout, column: str) -> list[str]:
    """The non-empty values of ``column`` in the file's first rows, as text (for checks and messages)."""
    if column in layout.derived:
        return [layout.derived[column]]
    if layout.file_format == "parquet":
        import pyarrow.parquet as pq

        filesystem, inner = filesystem_of(layout.path)
        with filesystem.open_input_file(inner) as handle:
            first = next(pq.ParquetFile(handle).iter_batches(batch_size=100, columns=[column]), None)
        sample = [] if first is None else [None if v is None else str(v) for v in first.column(0).to_pylist()]
    else:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        complete = layout.head[: layout.head.rfind(b"\n") + 1] or layout.head
        sample = pacsv.read_csv(
            pa.py_buffer(complete), read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=layout.delimiter, invalid_row_handler=lambda row: "skip"),
            convert_options=pacsv.ConvertOptions(column_types={column: pa.string()}, include_columns=[column],
                                                 strings_can_be_null=False),
        )[column].to_pylist()
    return [value.strip() for value in sample if value is not None and value.strip() not in NULL_TOKENS]


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
        # A column listed in categorical_columns stays a category even when it holds booleans.
        categorical = [c for c in features if c in spec.categorical_columns]
        boolean = [c for c in features if c not in categorical and _looks_boolean(first, c)]
    else:
        boolean = [c for c in features if _looks_boolean(first, c)]
        categorical = [c for c in features if c not in boolean and _looks_categorical(first, c)]
    numeric = [c for c in features if c not in categorical and c not in boolean]
    return ColumnPlan(numeric, categorical, spec.label_column, _label_is_text(first, spec), boolean)


def _label_is_text(layout: SourceLayout, spec: PreprocessSpec) -> bool:
    """Whether the label is read as text: a classification label whose first values are not numbers.

    A regression label is always numeric, so text in it stays the non-numeric error it is today.
    """
    if spec.task != "classification" or not _looks_categorical(layout, spec.label_column):
        return False
    sample = quotable(sorted(set(_head_values(layout, spec.label_column)))[:5])
    if spec.label_threshold is not None:
        raise DataSourceError(
            f"label_threshold={spec.label_threshold} makes two classes of a numeric label, but label column "
            f"{spec.label_column!r} of {layout.uri!r} holds text, e.g. {sample}: drop label_threshold to use its "
            f"values as the classes, or give a numeric label"
        )
    if spec.label_range is not None:
        raise DataSourceError(
            f"label_range={spec.label_range} checks a numeric label, but label column {spec.label_column!r} of "
            f"{layout.uri!r} holds text, e.g. {sample}: drop label_range (each text value is a class)"
        )
    return True
