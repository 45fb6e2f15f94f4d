"""The classification label: each row's class, the per-class hash histograms that stratify the split,
and the checks on the classes.

A class is named by its *key*: the text of a text label, the integer (as text) of an integer-valued
numeric label, or ``"0"``/``"1"`` with ``label_threshold``. Pass 1 counts each class's kept rows
per hash bin (:func:`class_summary`, merged with :func:`merge_class_summaries`);
:func:`fit_classes` turns the merged counts into the classes (sorted) and each class's cut points,
or raises the first bad-label error; pass 2 and the per-split summaries then place each row
(:func:`stratified_split`) and write its class index.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from airflow_ray_ml_stages.data.batch import Batch, BatchContext
from airflow_ray_ml_stages.data.split import STRATA_BINS, split_of_bins, stratified_cuts
from airflow_ray_ml_stages.data.validation import merge_finding
from airflow_ray_ml_stages.errors import DataSourceError, quotable

SAMPLE_CLASSES = 5


def label_key(value: float) -> str:
    """A numeric label value as its class key (and profile key): ``"5"`` for 5.0."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def key_order(key: str) -> tuple:
    """Sort order of class keys: integer keys by value, before any text key (then by text)."""
    try:
        return (0, int(key), "")
    except ValueError:
        return (1, 0, key)


def row_classes(label: np.ndarray, label_codes: np.ndarray | None, label_values: list | None,
                ctx: BatchContext) -> tuple[np.ndarray, list[str]]:
    """Each kept row's class as an index into the returned class keys (some keys may have no row).

    :param label: the kept rows' numeric label column.
    :param label_codes: a text label's codes for the kept rows (None: numeric label).
    """
    if label_codes is not None:
        return label_codes.astype("int64", copy=False), [str(value) for value in label_values]
    if ctx.label_threshold is not None:
        return (label >= ctx.label_threshold).astype("int64"), ["0", "1"]
    found, local = np.unique(label, return_inverse=True)
    return local.astype("int64", copy=False), [label_key(value) for value in found]


def class_summary(batch: Batch, keep: np.ndarray, bins: np.ndarray, ctx: BatchContext) -> dict[str, Any]:
    """Pass 1's classification summary of one batch: per class key, its kept rows per hash bin.

    Also the findings that make classes impossible: non-integer numeric labels (without
    ``label_threshold``), or more distinct classes in the batch than ``max_categories`` (then no
    histograms: a numeric target read as classes could have a class per row).
    """
    summary: dict[str, Any] = {"histograms": {}, "not_integral": {}, "too_many": []}
    label, label_codes = batch.kept_label(keep)
    if label_codes is None and ctx.label_threshold is None:
        with np.errstate(invalid="ignore"):
            fractional = keep & (batch.numeric[:, -1] != np.round(batch.numeric[:, -1]))
        if fractional.any():
            summary["not_integral"] = {ctx.label: batch.finding(fractional, ctx)}
            return summary
    local, keys = row_classes(label, label_codes, batch.label_values, ctx)
    present = np.flatnonzero(np.bincount(local, minlength=len(keys)))
    if len(present) > ctx.max_categories:
        summary["too_many"] = sorted((keys[index] for index in present), key=key_order)[: ctx.max_categories + 1]
        return summary
    counts = np.bincount(local * STRATA_BINS + bins, minlength=len(keys) * STRATA_BINS).reshape(len(keys), STRATA_BINS)
    summary["histograms"] = {keys[index]: counts[index].tolist() for index in present}
    return summary


def empty_class_summary() -> dict[str, Any]:
    return {"histograms": {}, "not_integral": {}, "too_many": []}


def merge_class_summaries(into: dict[str, Any], part: dict[str, Any], max_classes: int) -> None:
    """Add one batch's class summary to ``into`` (histograms as numpy arrays).

    Past ``max_classes`` classes the histograms are dropped (the run fails on them anyway) and only
    a few more class keys are kept, so a numeric target read as classes cannot exhaust memory.
    """
    merge_finding(into["not_integral"], part["not_integral"])
    if part["too_many"] or into["too_many"]:
        keys = {*into["too_many"], *into["histograms"], *part["too_many"], *part["histograms"]}
        into["too_many"], into["histograms"] = sorted(keys, key=key_order)[: max_classes + 1], {}
        return
    for key, counts in part["histograms"].items():
        if key in into["histograms"]:
            into["histograms"][key] += np.asarray(counts, dtype="int64")
        else:
            into["histograms"][key] = np.asarray(counts, dtype="int64")
    if len(into["histograms"]) > max_classes:
        into["too_many"], into["histograms"] = sorted(into["histograms"], key=key_order)[: max_classes + 1], {}


def _describe(finding: dict) -> str:
    files = ", ".join(f"{uri!r} ({count} rows)" for uri, count in sorted(finding["files"].items()))
    return f"in {files}; sample rows: {json.dumps(finding['samples'])}"


def fit_classes(classes_total: dict[str, Any], ctx: BatchContext) -> tuple[list[Any], dict[str, list[int]]]:
    """The classes in index order and each class's cut points, or the first bad-label error.

    Classes are sorted: integers ascending for a numeric label (``[0, 1]`` with
    ``label_threshold``), strings for a text label.
    """
    for column, finding in classes_total["not_integral"].items():
        raise DataSourceError(
            f"label column {column!r} has {finding['count']} non-integer value(s) {_describe(finding)}, but "
            f"classification takes each label value as a class: use task='regression' for a continuous target, "
            f"or label_threshold to make two classes (label >= threshold is class 1)"
        )
    keys = classes_total["too_many"] or list(classes_total["histograms"])
    classes: list[Any] = sorted(keys) if ctx.label_text else sorted(int(key) for key in keys)
    if len(keys) > ctx.max_categories:
        raise DataSourceError(
            f"label column {ctx.label!r} has more distinct classes than max_categories={ctx.max_categories}, "
            f"e.g. {quotable(classes[:SAMPLE_CLASSES])}: use task='regression' for a numeric target, label_threshold to make "
            f"two classes, or raise max_categories"
        )
    if len(keys) < 2:
        raise DataSourceError(
            f"label column {ctx.label!r} has only one class {classes} in its kept rows: classification needs at "
            f"least two classes. Check the label column and the data"
            + (f", or choose another label_threshold than {ctx.label_threshold}" if ctx.label_threshold is not None
               else "")
        )
    cuts = {key: list(stratified_cuts(histogram, ctx.split)) for key, histogram in classes_total["histograms"].items()}
    return classes, cuts


def stratified_split(local: np.ndarray, keys: list[str], bins: np.ndarray,
                     ctx: BatchContext) -> tuple[np.ndarray, np.ndarray]:
    """Each kept row's split (from its class's cut points) and its class index into ``ctx.classes``."""
    index = {str(value): position for position, value in enumerate(ctx.classes)}
    known = [ctx.cuts.get(key) for key in keys]
    train_end = np.array([cut[0] if cut else 0 for cut in known] + [0], dtype="int16")
    validation_end = np.array([cut[1] if cut else 0 for cut in known] + [0], dtype="int16")
    class_index = np.array([index.get(key, -1) for key in keys] + [-1], dtype="int64")[local]
    if (class_index < 0).any():  # pass 1 saw every kept row: a row of an unknown class is a bug
        raise RuntimeError(f"rows of classes {sorted({keys[i] for i in local[class_index < 0]})} unseen in pass 1")
    return split_of_bins(bins, train_end[local], validation_end[local]), class_index


def place_rows(label: np.ndarray, label_codes: np.ndarray | None, label_values: list | None, bins: np.ndarray,
               ctx: BatchContext) -> tuple[np.ndarray, np.ndarray]:
    """Kept rows' split and class index, from their label and hash bin (``ctx.cuts`` known)."""
    local, keys = row_classes(label, label_codes, label_values, ctx)
    return stratified_split(local, keys, bins, ctx)
