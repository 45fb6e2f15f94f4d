"""The row checks and their error messages: non-numeric, not boolean, NaN/infinite/missing, labels out of range.

:func:`clean_batch` finds the failing rows of a batch (per file, with samples);
:func:`raise_findings` turns the merged findings into the first error, naming the file, the column
and sample rows; :func:`diagnose_csv` finds the non-numeric values a typed CSV read failed on.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from airflow_ray_ml_stages.data.batch import BAD_VALUES, Batch, BatchContext
from airflow_ray_ml_stages.data.deferred_pandas import import_pandas
from airflow_ray_ml_stages.data.schema import NULL_TOKENS, ColumnPlan
from airflow_ray_ml_stages.data.sources import SAMPLE_ROWS, SourceLayout, filesystem_of
from airflow_ray_ml_stages.errors import DataSourceError, quotable


def merge_finding(into: dict[str, dict], found: dict[str, dict]) -> None:
    """Add one batch's findings per column to ``into``: counts per file, and the first sample rows."""
    for column, finding in found.items():
        current = into.setdefault(column, {"count": 0, "files": {}, "samples": []})
        current["count"] += finding["count"]
        for uri, count in finding["files"].items():
            current["files"][uri] = current["files"].get(uri, 0) + count
        current["samples"] = (current["samples"] + finding["samples"])[:SAMPLE_ROWS]
        if "values" in finding:  # a boolean column's values that are not booleans
            current["values"] = sorted({*current.get("values", []), *finding["values"]})[:BAD_VALUES]


def clean_batch(batch: Batch, ctx: BatchContext) -> tuple[np.ndarray, dict[str, dict], dict]:
    """Rows to keep, NaN/infinite/missing findings per column, and labels-out-of-range findings.

    With ``nan_policy='impute'`` only the label's findings drop rows; a feature's missing values
    are kept for the preprocessor to impute (an infinite one becomes missing, in ``batch`` itself),
    and their findings go to :func:`imputed_findings`.
    """
    finite = np.isfinite(batch.numeric)
    impute = ctx.nan_policy == "impute"
    bad_any = ~finite[:, -1] if impute else ~finite.all(axis=1)
    non_finite: dict[str, dict] = {}
    if not finite.all():
        for index, column in enumerate([*ctx.numeric, ctx.label]):
            bad = ~finite[:, index]
            if bad.any() and not (impute and column != ctx.label):
                non_finite[column] = batch.finding(bad, ctx)
        if impute:
            features = batch.numeric[:, :-1]
            features[~finite[:, :-1]] = np.nan
    for column in ctx.categorical:
        bad = batch.codes[column] < 0
        if bad.any() and not impute:
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


def imputed_findings(batch: Batch, keep: np.ndarray, ctx: BatchContext) -> dict[str, int]:
    """``nan_policy='impute'``: per feature column, how many kept rows of the batch miss a value."""
    if ctx.nan_policy != "impute":
        return {}
    found = {column: int(np.isnan(batch.numeric[keep, index]).sum()) for index, column in enumerate(ctx.numeric)}
    found.update({column: int((batch.codes[column][keep] < 0).sum()) for column in ctx.categorical})
    return {column: count for column, count in found.items() if count}


def clean(frame: pd.DataFrame, uris: list[str], ctx: BatchContext) -> tuple[np.ndarray, dict[str, dict], dict]:
    """:func:`clean_batch` for a pandas frame of the used columns in canonical types."""
    return clean_batch(Batch.from_frame(frame, uris, ctx), ctx)


def raise_findings(total: dict[str, Any], ctx: BatchContext) -> None:
    """Raise the first failed check with the file, the column and sample rows."""
    def describe(finding: dict) -> str:
        files = ", ".join(f"{uri!r} ({count} rows)" for uri, count in sorted(finding["files"].items()))
        return f"in {files}; sample rows: {json.dumps(finding['samples'])}"

    for column, finding in total["non_numeric"].items():
        if column in ctx.boolean:
            raise DataSourceError(
                f"column {column!r} holds booleans in its first rows (true/false or yes/no) but has "
                f"{finding['count']} other value(s) such as {finding.get('values', [])} {describe(finding)}. Fix the "
                f"values, or list {column!r} in categorical_columns to use its values as categories"
            )
        raise DataSourceError(
            f"column {column!r} must be numeric but has {finding['count']} non-numeric value(s) {describe(finding)}. "
            f"Fix the values, or {_text_fix(column, ctx.label)}"
        )
    if total["non_finite"] and ctx.nan_policy == "fail":
        column, finding = next(iter(total["non_finite"].items()))
        others = sorted(set(total["non_finite"]) - {column})
        raise DataSourceError(
            f"column {column!r} has {finding['count']} NaN, infinite or missing value(s) {describe(finding)}"
            + (f"; columns {others} have some too" if others else "")
            + ". Clean the data, or set nan_policy='impute' to fill the features' missing values from the training "
              "split (rows without a label are dropped), or 'drop' to drop those rows and count them"
        )
    for column, finding in total["label_out_of_range"].items():
        raise DataSourceError(
            f"label column {column!r} has {finding['count']} value(s) outside label_range {ctx.label_range} "
            f"{describe(finding)}. Fix the labels or widen label_range"
        )
    # A classification split (decided after this check) gives every class a training row.
    if total["kept"] == 0 or (not ctx.stratified and total["splits"]["train"]["rows"] == 0):
        raise DataSourceError(
            f"no training rows: {total['rows']} rows read, {total['rows'] - total['kept']} dropped, "
            f"split {ctx.split}. Give more data or a larger train fraction"
        )


def diagnose_csv(layouts: list[SourceLayout], plan: ColumnPlan, chunk_rows: int = 200_000) -> None:
    """After the typed read failed: find the non-numeric values, streaming each file with pandas."""
    pd = import_pandas()

    for layout in layouts:
        if layout.file_format != "csv":
            continue
        numeric = [c for c in layout.columns if c in plan.numeric or (c == plan.label and not plan.label_text)]
        filesystem, inner = filesystem_of(layout.path)
        with filesystem.open_input_stream(inner) as stream:
            chunks = pd.read_csv(stream, sep=layout.delimiter, dtype=str, keep_default_na=False,
                                 chunksize=chunk_rows, encoding="utf-8-sig")
            for number, chunk in enumerate(chunks):
                for column in numeric:
                    text = chunk[column]
                    bad = pd.to_numeric(text, errors="coerce").isna() & ~text.str.strip().isin(NULL_TOKENS)
                    if bad.any():
                        rows = chunk[bad].head(SAMPLE_ROWS)
                        samples = [quotable({"line": int(number * chunk_rows + index + 2), **row})
                                   for index, row in zip(rows.index - chunk.index[0], rows.to_dict("records"))]
                        raise DataSourceError(
                            f"column {column!r} must be numeric but {layout.uri!r} has non-numeric value(s) "
                            f"{quotable(sorted(set(text[bad].head(10))))}; sample rows: {json.dumps(samples)}. Fix the values, "
                            f"or {_text_fix(column, plan.label)}"
                        )


def _text_fix(column: str, label: str) -> str:
    """What to do about text in a numeric column: a category for a feature, classes for the label."""
    if column == label:
        return ("set task='classification' to use the label's values as classes (a classification label is read "
                "as text only when its first rows hold no numbers: make all its values text or all numbers)")
    return f"list {column!r} in categorical_columns if it is a category"
