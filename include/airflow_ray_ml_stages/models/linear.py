"""A linear model as plain arrays: written from a fitted ridge or logistic regression, applied with numpy.

``linear.npz`` (read with ``allow_pickle=False``) holds ``coef`` (outputs x features) and
``intercept`` (outputs), and ``kind``: 0 regression (``x @ coef.T + intercept``), 1 binary
classification (the second class's probability is the sigmoid of that), 2 classes (softmax over
them), with the columns in class-index order. scikit-learn is needed to train, not to serve.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

LINEAR_MODEL = "linear.npz"
REGRESSION, BINARY, MULTICLASS = 0, 1, 2


def linear_bytes(model: Any, classes: int | None) -> bytes:
    """A fitted scikit-learn ``Ridge`` or ``LogisticRegression`` as the bytes of ``linear.npz``.

    :param classes: the number of classes (the model's ``classes_`` are class indexes, some possibly
        absent from the training rows); None for a regression.
    """
    coef = np.atleast_2d(np.asarray(model.coef_, dtype=np.float64))
    intercept = np.atleast_1d(np.asarray(model.intercept_, dtype=np.float64))
    kind = REGRESSION
    if classes is not None:
        seen = np.asarray(model.classes_, dtype=np.int64)
        if len(seen) == 2:  # one row: the log odds of seen[1] against seen[0]
            full_coef, full_intercept = np.zeros((classes, coef.shape[1])), np.full(classes, -np.inf)
            full_coef[seen[1]], full_intercept[seen[1]] = coef[0], intercept[0]
            full_intercept[seen[0]] = 0.0
            coef, intercept, kind = full_coef, full_intercept, MULTICLASS
            if classes == 2:
                coef, intercept, kind = coef[1:] - coef[:1], intercept[1:] - intercept[:1], BINARY
        else:
            full_coef, full_intercept = np.zeros((classes, coef.shape[1])), np.full(classes, -np.inf)
            full_coef[seen], full_intercept[seen] = coef, intercept  # an absent class: probability 0
            coef, intercept, kind = full_coef, full_intercept, MULTICLASS
    buffer = io.BytesIO()
    np.savez(buffer, coef=coef, intercept=intercept, kind=np.asarray([kind]))
    return buffer.getvalue()


class LinearWeights:
    """``linear.npz`` read back: :meth:`predict` gives values, or each class's probability."""

    def __init__(self, data: bytes) -> None:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            missing = [name for name in ("coef", "intercept", "kind") if name not in arrays.files]
            if missing:
                raise ValueError(f"{LINEAR_MODEL} lacks the array(s) {missing}")
            self.coef, self.intercept = arrays["coef"].astype(np.float64), arrays["intercept"].astype(np.float64)
            self.kind = int(arrays["kind"][0])
        if self.coef.ndim != 2 or self.intercept.shape != (self.coef.shape[0],) or \
                self.kind not in (REGRESSION, BINARY, MULTICLASS):
            raise ValueError(f"{LINEAR_MODEL} is inconsistent: coef {self.coef.shape}, intercept "
                             f"{self.intercept.shape}, kind {self.kind}")

    @property
    def n_features(self) -> int:
        return self.coef.shape[1]

    def check_features(self, count: int) -> None:
        """ValueError where the coefficients are not one per feature of ``count``."""
        if self.n_features != count:
            raise ValueError(f"the linear model takes {self.n_features} features, but the card lists {count} "
                             "feature columns")

    def predict(self, features: np.ndarray) -> np.ndarray:
        scores = np.asarray(features, dtype=np.float64) @ self.coef.T + self.intercept
        if self.kind == REGRESSION:
            return scores[:, 0]
        if self.kind == BINARY:
            positive = 1.0 / (1.0 + np.exp(-scores[:, 0]))
            return np.column_stack([1.0 - positive, positive])
        scores -= scores.max(axis=1, keepdims=True)
        exponent = np.exp(scores)
        return exponent / exponent.sum(axis=1, keepdims=True)


def linear_predict(data: bytes, features: np.ndarray) -> np.ndarray:
    """What a served model directory's ``linear.npz`` predicts for ``features``."""
    return LinearWeights(data).predict(features)
