"""Cross-validation folds of a small table, for the tune stage's trials (``TuneSpec.cv_folds``).

On a table of a few hundred or thousand rows, a validation split of 60-400 rows ranks two close
families by chance, and the ensemble's weights fit its noise. There the tune stage pools the
training and validation splits and deals them into ``k`` folds once (:func:`write_folds`); every
trial then trains ``k`` models, each on the rows of the other folds, and is ranked by its
out-of-fold predictions on all the pooled rows. The trial's model is the average of its ``k``
fold models (bagging, as AutoGluon's bagged models are): each saw more rows than the training
split holds, and their average varies less than one of them.

The test split is never pooled: choosing does not see it.
"""

from __future__ import annotations

import io

import numpy as np

from airflow_ray_ml_stages import artifacts

FOLDS_DIR = "folds"
ENOUGH_VALIDATION_ROWS = 300
"""A validation split of fewer rows is cross-validated: the size at which the quality bench judges a
table's test split at all (docs/benchmarks.md)."""
ENOUGH_CLASS_ROWS = 100
"""A validation split with fewer rows of some class is cross-validated: a log loss or an accuracy
moves with the few rows of a rare class (50 defaults among 1,500 card holders), whatever the total."""


def cross_validation_reason(validation_labels: np.ndarray, classes: list | None, pooled_rows: int, folds: int,
                            max_rows: int) -> str | None:
    """Why the trials are cross-validated (for the task log), or None where one validation split ranks them.

    :param validation_labels: the validation split's labels (for classification, indexes into ``classes``).
    :param classes: the classification's classes; None: regression.
    :param pooled_rows: the training and validation rows together; above ``max_rows`` (or with
        ``folds`` 0) there is no cross-validation.
    """
    if not folds or pooled_rows > max_rows or pooled_rows < 2 * folds:  # a fold needs rows to train and validate on
        return None
    rows = len(validation_labels)
    if rows < ENOUGH_VALIDATION_ROWS:
        return f"the validation split holds {rows} rows (fewer than {ENOUGH_VALIDATION_ROWS})"
    if classes is not None:
        counts = np.bincount(np.asarray(validation_labels, np.int64), minlength=len(classes))
        rarest = int(np.argmin(counts))
        if counts[rarest] < ENOUGH_CLASS_ROWS:
            return (f"the validation split holds {counts[rarest]} rows of class {classes[rarest]!r} (fewer than "
                    f"{ENOUGH_CLASS_ROWS})")
    return None


def fold_of_rows(labels: np.ndarray, folds: int, seed: int, classification: bool) -> np.ndarray:
    """Each row's fold (0..folds-1): a seeded shuffle dealt round-robin, class by class for classification.

    Dealing each class in turn, continuing the deal where the last class left off, gives every
    fold the classes' shares (stratified) and folds whose sizes differ by at most one row.
    """
    generator = np.random.default_rng(seed)
    assignment = np.empty(len(labels), np.int64)
    groups = [np.flatnonzero(labels == value) for value in np.unique(labels)] if classification else [
        np.arange(len(labels))]
    dealt = 0
    for rows in groups:
        shuffled = generator.permutation(rows)
        assignment[shuffled] = (np.arange(dealt, dealt + len(shuffled))) % folds
        dealt += len(shuffled)
    return assignment


def write_folds(train_uri: str, validation_uri: str, columns: list[str], label: str, folds: int, seed: int,
                classification: bool, target: str) -> list[dict[str, str]]:
    """Pool the two splits' ``columns`` and write each fold's ``train`` and ``validation`` Parquet files.

    :return: per fold, the split URIs a training loop reads (``uris``): fold ``i`` validates on
        its own rows and trains on the others. The folds' validation rows, in fold order, are the
        rows every trial's out-of-fold predictions follow.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_ray_ml_stages.train.splits import ParquetSplit

    pooled = pa.concat_tables([ParquetSplit(uri, columns).to_table(columns=columns)
                               for uri in (train_uri, validation_uri)])
    labels = np.asarray(pooled.column(label).to_numpy(zero_copy_only=False), np.float64)
    assignment = fold_of_rows(labels, folds, seed, classification)
    written = []
    for fold in range(folds):
        uris = {}
        for split, rows in (("train", assignment != fold), ("validation", assignment == fold)):
            buffer = io.BytesIO()
            pq.write_table(pooled.filter(pa.array(rows)), buffer)
            uris[split] = artifacts.join(target, FOLDS_DIR, str(fold), f"{split}.parquet")
            artifacts.write_bytes_atomic(uris[split], buffer.getvalue())
        written.append(uris)
    return written
