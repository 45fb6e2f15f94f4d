"""Drift: how far a file to score has moved from the rows its model was trained on, column by column.

The data stage keeps, in the fitted preprocessor (``reference``), each feature's training
distribution: a numeric or boolean column's decile edges with the training share in each bin, a
categorical column's share of each category, and every column's share of missing values
(:func:`training_reference`). The score stage counts the file's values into the same bins
(:class:`DriftCounter`, batch by batch) and scores each column by its population stability
index (PSI): ``sum((input share - training share) * ln(input share / training share))`` over the
bins, a bin of missing values, and for a categorical column a bin of categories training never
saw (:func:`drift_report`).

The verdict follows the common convention (settings of the score stage): PSI below
``watch`` (0.1) is stable, from ``watch`` to ``alert`` (0.25) is worth watching, above ``alert`` is
drift. The file's verdict is its worst column's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DRIFT_SAMPLE_VALUES = 20_000
"""The most training values per column whose deciles become the bin edges (a seeded uniform sample
past this many): the edges of 20,000 values are within a fraction of a per cent of the whole split's."""
QUANTILES = np.linspace(0.1, 0.9, 9)
SHARE_FLOOR = 1e-4
"""A bin's share in the PSI is at least this: an empty bin (a category training never saw) counts as
rare, not as infinitely rare."""
VERDICTS = ("stable", "watch", "drift")


def training_reference(train: dict[str, Any], numeric_columns: list[str],
                       categorical_columns: list[str]) -> dict[str, dict[str, Any]]:
    """Every feature's reference from the data stage's merged training-split summary: its rows, a
    sample of each numeric (and boolean) column's present values (``drift_samples``, in
    ``numeric_columns`` order), each category's count and each column's count of missing values."""
    rows, missing = int(train["rows"]), train.get("missing") or {}
    samples = train.get("drift_samples") or [[] for _ in numeric_columns]
    reference = {column: numeric_reference(values, missing.get(column, 0), rows)
                 for column, values in zip(numeric_columns, samples)}
    reference.update({column: categorical_reference(train["categories"].get(column, {}), missing.get(column, 0), rows)
                      for column in categorical_columns})
    return reference


def _shares(counts: np.ndarray) -> np.ndarray:
    total = counts.sum()
    return counts / total if total else counts.astype("float64")


def numeric_reference(values: np.ndarray, missing: int, rows: int) -> dict[str, Any]:
    """One numeric (or boolean) column's reference from a sample of its present training ``values``,
    and the training split's count of missing values among ``rows``."""
    values = np.asarray(values, dtype="float64")
    edges = np.unique(np.quantile(values, QUANTILES)) if len(values) else np.array([])
    counts = np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges) + 1)
    return {"edges": edges.tolist(), "shares": _shares(counts).tolist(), "missing": missing / rows if rows else 0.0}


def categorical_reference(counts: dict[str, int], missing: int, rows: int) -> dict[str, Any]:
    """One categorical column's reference from the training split's count of each category."""
    present = sum(counts.values())
    return {"categories": {str(value): count / present for value, count in sorted(counts.items())} if present else {},
            "missing": missing / rows if rows else 0.0}


class DriftCounter:
    """Counts a file's values into its model's reference bins, batch by batch."""

    def __init__(self, reference: dict[str, dict[str, Any]]) -> None:
        self.reference = reference
        self.rows = 0
        # per column: a numeric one's edges, or a categorical one's position of each category
        self.bins = {column: np.asarray(ref["edges"], dtype="float64") if "edges" in ref
                     else {value: position for position, value in enumerate(ref["categories"])}
                     for column, ref in reference.items()}
        # per column: one count per bin (a category's last: one training never saw), then the missing ones
        self.counts = {column: np.zeros(len(bins) + 2, dtype=np.int64) for column, bins in self.bins.items()}

    def add(self, columns: dict[str, Any], rows: int, missing: dict[str, np.ndarray]) -> None:
        """Count one batch: per column, its values (numbers as floats, categories as text) and where
        each is missing (``missing``, a boolean array)."""
        self.rows += rows
        for column, bins in self.bins.items():
            absent = missing[column]
            counts = self.counts[column]
            counts[-1] += int(absent.sum())
            if isinstance(bins, np.ndarray):
                positions = np.searchsorted(bins, np.asarray(columns[column], dtype="float64")[~absent], side="left")
            else:
                values = np.asarray(columns[column], dtype=object)[~absent]
                positions = np.array([bins.get(str(value), len(bins)) for value in values], dtype=np.int64)
            counts[:-1] += np.bincount(positions, minlength=len(bins) + 1)


def psi(actual: np.ndarray, expected: np.ndarray) -> float:
    """The population stability index of ``actual`` shares against ``expected`` ones (floored at
    :data:`SHARE_FLOOR`)."""
    actual = np.maximum(np.asarray(actual, dtype="float64"), SHARE_FLOOR)
    expected = np.maximum(np.asarray(expected, dtype="float64"), SHARE_FLOOR)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def verdict_of(value: float, watch: float, alert: float) -> str:
    return "drift" if value > alert else "watch" if value >= watch else "stable"


def drift_report(counter: DriftCounter, watch: float, alert: float) -> dict[str, Any]:
    """Per column: its PSI, verdict and missing shares (and for a category, the share training never
    saw); the file's verdict (its worst column's) and the drifted columns, worst first."""
    columns = {}
    for column, ref in counter.reference.items():
        counts = counter.counts[column]
        rows = int(counts.sum())
        missing_share = counts[-1] / rows if rows else 0.0
        present = counts[:-1]
        if "edges" in ref:
            expected_present = np.asarray(ref["shares"], dtype="float64")
        else:
            expected_present = np.append(np.asarray(list(ref["categories"].values()), dtype="float64"), 0.0)
        expected = np.append(expected_present * (1.0 - ref["missing"]), ref["missing"])
        actual = _shares(counts) if rows else expected
        value = psi(actual, expected)
        entry = {"kind": "number" if "edges" in ref else "category", "psi": round(value, 4),
                 "verdict": verdict_of(value, watch, alert), "missing": round(float(missing_share), 4),
                 "training_missing": round(float(ref["missing"]), 4)}
        if "categories" in ref:
            entry["unseen"] = round(float(present[-1] / rows), 4) if rows else 0.0
        columns[column] = entry
    ranked = sorted(columns, key=lambda column: -columns[column]["psi"])
    worst = max((VERDICTS.index(entry["verdict"]) for entry in columns.values()), default=0)
    drifted = [column for column in ranked if columns[column]["verdict"] == "drift"]
    return {"verdict": VERDICTS[worst], "rows": counter.rows, "watch": watch, "alert": alert,
            "drifted": drifted, "columns": columns, "reason": drift_reason(drifted, columns)}


def drift_reason(drifted: list[str], columns: dict[str, dict[str, Any]]) -> str:
    """``drift in alcohol (PSI 0.41), density (0.28)``, or empty where no column drifted."""
    if not drifted:
        return ""
    named = [f"{column} (PSI {columns[column]['psi']:.2f})" if index == 0 else
             f"{column} ({columns[column]['psi']:.2f})" for index, column in enumerate(drifted[:5])]
    more = f" and {len(drifted) - 5} more" if len(drifted) > 5 else ""
    return f"drift in {', '.join(named)}{more}"
