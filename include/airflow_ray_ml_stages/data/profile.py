"""Pass 1's summaries: per batch and split, row counts, mergeable moments, categories and labels.

Each batch is summarised (:func:`summarise_and_split`), the summaries are merged
(:func:`merge_summaries`), and the merged total becomes the data profile (:func:`build_profile`,
written as ``profile.json``).

Classification splits by class at cut points that need every row's class first, so its pass 1
summarises the findings and the classes' hash histograms only (no splits yet); once the cut points
are known, a second summary pass (:func:`split_summaries` per batch, merged with
:func:`merge_split_summaries`) gives the per-split part.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from airflow_ray_ml_stages.data.batch import Batch, BatchContext
from airflow_ray_ml_stages.data.labels import class_summary, empty_class_summary, label_key, merge_class_summaries, place_rows
from airflow_ray_ml_stages.data.schema import ColumnPlan
from airflow_ray_ml_stages.data.sources import SourceLayout
from airflow_ray_ml_stages.data.split import SPLITS, bins_of_hashes
from airflow_ray_ml_stages.data.validation import clean_batch, imputed_findings, merge_finding
from airflow_ray_ml_stages.drift import DRIFT_SAMPLE_VALUES
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
    """:func:`summarise_batch`, the rows kept, and where each kept row goes.

    That is each kept row's split index, except in classification's pass 1 (``ctx.cuts`` not yet
    known), which summarises no splits and returns each kept row's hash bin instead (what pass 2
    needs to place the row once the cut points are known).
    """
    keep, non_finite, out_of_range = clean_batch(batch, ctx)
    numeric = take_rows(batch.numeric, keep) if not keep.all() else batch.numeric
    label = numeric[:, -1]
    integral = bool(np.all(label == np.round(label)))
    summary: dict[str, Any] = {
        "rows": len(batch), "kept": int(keep.sum()), "non_numeric": batch.non_numeric,
        "non_finite": non_finite, "label_out_of_range": out_of_range, "label_integral": integral, "splits": {},
        "imputed": imputed_findings(batch, keep, ctx),
    }
    codes = {column: batch.codes[column][keep] for column in ctx.categorical}
    class_index = None
    if not ctx.stratified:
        splits = batch.splits(keep, ctx)
    else:
        bins = bins_of_hashes(batch.hashes(keep, ctx))
        if ctx.cuts is None:
            summary["classes"] = class_summary(batch, keep, bins, ctx)
            summary["splits"] = {name: _empty_split(numeric.shape[1]) for name in SPLITS}
            return summary, keep, bins
        kept_label, label_codes = batch.kept_label(keep)
        splits, class_index = place_rows(kept_label, label_codes, batch.label_values, bins, ctx)
    summary["splits"] = split_summaries(numeric, codes, batch.values, splits, class_index, ctx)
    return summary, keep, splits


def _empty_split(width: int) -> dict[str, Any]:
    return {"rows": 0, "moments": Moments.empty(width).to_dict(), "categories": {}, "labels": {}}


SAMPLE_VALUES = 100_000
"""``nan_policy='impute'``: the most training values per column kept to take the median of (it is
exact up to this many training rows, else the median of a seeded uniform sample of them)."""


# What each sample of the training values is kept for, and its size: the imputed medians, the drift bins.
SAMPLES = {"samples": SAMPLE_VALUES, "drift_samples": DRIFT_SAMPLE_VALUES}


def _sample(values: np.ndarray, seed: int, limit: int = SAMPLE_VALUES) -> np.ndarray:
    """At most ``limit`` of ``values``, a seeded uniform choice where there are more."""
    if len(values) <= limit:
        return values
    return np.random.default_rng(seed).choice(values, limit, replace=False)


def train_samples(part: np.ndarray, ctx: BatchContext, limit: int = SAMPLE_VALUES) -> list[list[float]]:
    """Per numeric and boolean column, the present values of a batch's training rows (a sample past
    ``limit``): what the imputed medians (:data:`SAMPLE_VALUES`) and the drift bins
    (:data:`~airflow_ray_ml_stages.drift.DRIFT_SAMPLE_VALUES`) are taken from."""
    return [_sample(part[~np.isnan(part[:, index]), index], ctx.seed, limit).tolist()
            for index in range(len(ctx.numeric))]


def medians(samples: list[list[float]]) -> list[float | None]:
    """Each column's median of its sampled training values; None where the training split has none."""
    return [float(np.median(values)) if len(values) else None for values in samples]


def split_summaries(numeric: np.ndarray, codes: dict[str, np.ndarray], values: dict[str, list], splits: np.ndarray,
                    class_index: np.ndarray | None, ctx: BatchContext) -> dict[str, dict[str, Any]]:
    """Per split: rows, moments, category counts and label counts of kept rows in canonical arrays.

    :param class_index: classification: each row's index into ``ctx.classes`` (the label counts
        are then per class); None: the label counts are per value of an integer-valued label.
    """
    label = numeric[:, -1]
    integral = class_index is None and bool(np.all(label == np.round(label)))
    out = {}
    for index, name in enumerate(SPLITS):
        mask = splits == index
        part = take_rows(numeric, mask)
        categories = {}
        for column in ctx.categorical:
            found = codes[column][mask]
            counts = np.bincount(found[found >= 0], minlength=len(values[column]))  # -1: missing (imputed)
            categories[column] = {str(values[column][i]): int(counts[i]) for i in np.flatnonzero(counts)}
        labels = {}
        if class_index is not None:
            counts = np.bincount(class_index[mask], minlength=len(ctx.classes))
            labels = {str(ctx.classes[i]): int(counts[i]) for i in np.flatnonzero(counts)}
        elif integral:
            found, counts = np.unique(part[:, -1], return_counts=True)
            labels = {label_key(k): int(v) for k, v in zip(found, counts)}
        out[name] = {"rows": int(mask.sum()), "moments": Moments.of(part).to_dict(),
                     "categories": categories, "labels": labels}
        if name == "train":
            out[name]["drift_samples"] = train_samples(part, ctx, DRIFT_SAMPLE_VALUES)
            out[name]["missing"] = {**{column: int(np.isnan(part[:, index]).sum())
                                       for index, column in enumerate(ctx.numeric)},
                                    **{column: int((codes[column][mask] < 0).sum()) for column in ctx.categorical}}
            if ctx.nan_policy == "impute":
                out[name]["samples"] = train_samples(part, ctx)
    return out


def summarise(frame: pd.DataFrame, uris: list[str], ctx: BatchContext, non_numeric: dict) -> dict[str, Any]:
    """:func:`summarise_batch` for a pandas frame of the used columns in canonical types."""
    return summarise_batch(Batch.from_frame(frame, uris, ctx, non_numeric), ctx)


def merge_summaries(summaries: Iterable[dict[str, Any]], width: int, max_classes: int = 100) -> dict[str, Any]:
    """The batches' summaries merged (moments as :class:`Moments`, class histograms as numpy arrays).

    :param max_classes: classification: past this many classes the histograms are dropped (see
        :func:`~airflow_ray_ml_stages.data.labels.merge_class_summaries`).
    """
    total: dict[str, Any] = {
        "rows": 0, "kept": 0, "non_numeric": {}, "non_finite": {}, "label_out_of_range": {}, "label_integral": True,
        "splits": _empty_splits(width), "classes": empty_class_summary(), "imputed": {},
    }
    for summary in summaries:
        total["rows"] += summary["rows"]
        total["kept"] += summary["kept"]
        for key in ("non_numeric", "non_finite", "label_out_of_range"):
            merge_finding(total[key], summary[key])
        for column, count in summary.get("imputed", {}).items():
            total["imputed"][column] = total["imputed"].get(column, 0) + count
        total["label_integral"] &= summary["label_integral"]
        if "classes" in summary:
            merge_class_summaries(total["classes"], summary["classes"], max_classes)
        _merge_splits(total["splits"], summary["splits"])
    return total


def _empty_splits(width: int) -> dict[str, dict[str, Any]]:
    return {name: {"rows": 0, "moments": Moments.empty(width), "categories": {}, "labels": {}} for name in SPLITS}


def _merge_splits(total: dict[str, dict[str, Any]], summary: dict[str, dict[str, Any]]) -> None:
    for name in SPLITS:
        into, part = total[name], summary[name]
        into["rows"] += part["rows"]
        into["moments"] = into["moments"].merge(Moments.from_dict(part["moments"]))
        for column, counts in part["categories"].items():
            target = into["categories"].setdefault(column, {})
            for value, count in counts.items():
                target[value] = target.get(value, 0) + count
        for value, count in part["labels"].items():
            into["labels"][value] = into["labels"].get(value, 0) + count
        for key, limit in SAMPLES.items():
            if key in part:
                found = into.setdefault(key, [[] for _ in part[key]])
                for index, values in enumerate(part[key]):
                    found[index] = _sample(np.concatenate([np.asarray(found[index]), np.asarray(values)]), index,
                                           limit).tolist()
        for column, count in part.get("missing", {}).items():
            into.setdefault("missing", {})[column] = into.get("missing", {}).get(column, 0) + count


def merge_split_summaries(parts: Iterable[dict[str, dict[str, Any]]], width: int) -> dict[str, dict[str, Any]]:
    """Per-split summaries (:func:`split_summaries`) of many batches merged, as ``merge_summaries`` does."""
    total = _empty_splits(width)
    for part in parts:
        _merge_splits(total, part)
    return total


def _stats(moments: Moments, columns: list[str]) -> dict[str, dict[str, float | None]]:
    std, counts = moments.std, moments.counts
    result = {}
    for index, column in enumerate(columns):
        if counts[index] == 0:
            result[column] = {"count": 0}
            continue
        result[column] = {"count": int(counts[index]), "mean": float(moments.mean[index]), "std": float(std[index]),
                          "min": float(moments.minimum[index]), "max": float(moments.maximum[index])}
    return result


def _label_profile(total: dict[str, Any], plan: ColumnPlan, spec: PreprocessSpec,
                   classes: list[Any] | None) -> dict[str, Any]:
    if classes is None:
        return {"column": plan.label, "integral": total["label_integral"],
                "distribution": ({name: dict(sorted(total["splits"][name]["labels"].items(), key=lambda kv: float(kv[0])))
                                  for name in SPLITS} if total["label_integral"] else None)}
    return {"column": plan.label, "task": "classification", "text": plan.label_text,
            "threshold": spec.label_threshold, "classes": classes,
            "class_counts": {name: {str(c): total["splits"][name]["labels"].get(str(c), 0) for c in classes}
                             for name in SPLITS}}


def build_profile(total: dict[str, Any], plan: ColumnPlan, spec: PreprocessSpec, layouts: list[SourceLayout],
                  fingerprint: str, classes: list[Any] | None = None) -> dict[str, Any]:
    """The data profile (``profile.json``) of the merged total; ``classes`` for classification."""
    width = len(plan.numeric) + len(plan.boolean) + 1
    # A boolean column's statistics are of its 1/0 values (the mean: the share of true); a text label has none.
    columns = [*plan.numeric, *plan.boolean, plan.label][: width - 1 if plan.label_text else width]
    overall = Moments.empty(width)
    for name in SPLITS:
        overall = overall.merge(total["splits"][name]["moments"])
    method = "seeded hash of each row's used values (sorted column order)"
    if classes is not None:
        method = ("stratified: within each class, rows are ordered by a seeded hash of their used values (sorted "
                  "column order) and cut at the fractions; every class has at least one training row")
    return {
        "fingerprint": fingerprint,
        "sources": [{"uri": l.uri, "format": l.file_format, "delimiter": l.delimiter, "columns": l.all_columns}
                    for l in layouts],
        "rows": {"read": total["rows"], "dropped": total["rows"] - total["kept"],
                 **{name: total["splits"][name]["rows"] for name in SPLITS}},
        "dropped_by_column": {c: f["count"] for c, f in total["non_finite"].items()},
        "imputed_by_column": dict(total.get("imputed", {})),
        "split": {"fractions": spec.split, "seed": spec.seed, "method": method},
        "columns": _stats(overall, columns),
        "columns_by_split": {name: _stats(total["splits"][name]["moments"], columns) for name in SPLITS},
        "categories": {c: {name: total["splits"][name]["categories"].get(c, {}) for name in SPLITS}
                       for c in plan.categorical},
        "boolean": list(plan.boolean),
        "label": _label_profile(total, plan, spec, classes),
    }
