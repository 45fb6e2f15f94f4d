"""Pass 1's summaries: per batch and split, row counts, mergeable moments, categories and labels.

Each batch is summarised (:func:`summarise_and_split`), the summaries are merged
(:func:`merge_summaries`), and the merged total becomes the data profile (:func:`build_profile`,
written as ``profile.json``).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from airflow_ray_ml_stages.data.batch import Batch, BatchContext
from airflow_ray_ml_stages.data.schema import ColumnPlan
from airflow_ray_ml_stages.data.sources import SourceLayout
from airflow_ray_ml_stages.data.split import SPLITS
from airflow_ray_ml_stages.data.validation import clean_batch, merge_finding
from airflow_ray_ml_stages.preprocessor import Moments
from airflow_ray_ml_stages.specs import PreprocessSpec


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
            merge_finding(total[key], summary[key])
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
