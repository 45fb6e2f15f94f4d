"""Which columns are what: the files' columns checked against each other and the spec, and planned.

:func:`plan_columns` raises on files that do not share one schema, a missing label or feature
column, or an unexpected column, and decides which features are numeric and which categorical
(:class:`ColumnPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_ray_ml_stages.data.sources import SourceLayout, filesystem_of
from airflow_ray_ml_stages.errors import DataSourceError
from airflow_ray_ml_stages.specs import PreprocessSpec


# Values pyarrow's CSV reader turns into null in a float column (its default null_values), which
# are missing values, not non-numeric ones.
NULL_TOKENS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                         "1.#QNAN", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null"})


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

        filesystem, inner = filesystem_of(layout.path)
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
