"""scikit-learn's forests as plain arrays: written from a fitted forest, read and applied with numpy only.

A forest's trees are stored in one ``forest.npz`` (read with ``allow_pickle=False``, so loading
runs no code), every tree's nodes one after the other:

- ``left``, ``right`` (int32): a node's children, as indexes into the whole file; -1 at a leaf;
- ``feature`` (int32) and ``threshold`` (float64): an inner node sends a row left where
  ``row[feature] <= threshold``, as scikit-learn does (features as float32, compared in float64);
- ``value`` (float64, nodes x outputs): a leaf's prediction: the mean label (regression) or each
  class's share of its rows (classification, columns in class-index order);
- ``roots`` (int32): each tree's first node; ``depth`` (int32, one value): the deepest tree's depth.

A forest's prediction is the mean of its trees' leaf values, as scikit-learn's ``predict`` (regression)
and ``predict_proba`` (classification) compute it. scikit-learn is needed to train, not to serve.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

FOREST_MODEL = "forest.npz"
_ARRAYS = ("left", "right", "feature", "threshold", "value", "roots", "depth")
ROW_CHUNK = 2048
"""Rows walked through the trees at once: bounds the rows x trees node indexes held (16 MiB at 1,000 trees)."""


def forest_arrays(forest: Any, classes: int | None) -> dict[str, np.ndarray]:
    """The arrays of a fitted scikit-learn forest (``estimators_`` of decision trees).

    :param classes: the number of classes for a classifier (its ``classes_`` are class indexes,
        some possibly absent from the training rows); None for a regressor.
    """
    lefts, rights, features, thresholds, values, roots = [], [], [], [], [], []
    start, depth = 0, 0
    for estimator in forest.estimators_:
        tree = estimator.tree_
        nodes = tree.node_count
        leaf = tree.children_left < 0
        lefts.append(np.where(leaf, -1, tree.children_left + start))
        rights.append(np.where(leaf, -1, tree.children_right + start))
        features.append(np.where(leaf, 0, tree.feature))
        thresholds.append(np.where(leaf, 0.0, tree.threshold))
        value = np.asarray(tree.value, dtype=np.float64)[:, 0, :]  # nodes x (1 | classes seen)
        if classes is not None:
            shares = value / np.maximum(value.sum(axis=1, keepdims=True), np.finfo(np.float64).tiny)
            value = np.zeros((nodes, classes))
            value[:, np.asarray(forest.classes_, dtype=np.int64)] = shares
        values.append(value)
        roots.append(start)
        start += nodes
        depth = max(depth, int(tree.max_depth))
    return {"left": np.concatenate(lefts).astype(np.int32), "right": np.concatenate(rights).astype(np.int32),
            "feature": np.concatenate(features).astype(np.int32),
            "threshold": np.concatenate(thresholds).astype(np.float64),
            "value": np.concatenate(values).astype(np.float64), "roots": np.asarray(roots, dtype=np.int32),
            "depth": np.asarray([depth], dtype=np.int32)}


def forest_bytes(forest: Any, classes: int | None) -> bytes:
    """A fitted forest as the bytes of ``forest.npz``."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **forest_arrays(forest, classes))
    return buffer.getvalue()


class ForestTrees:
    """A forest read from ``forest.npz``: :meth:`predict` averages its trees' leaf values."""

    def __init__(self, data: bytes) -> None:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            missing = [name for name in _ARRAYS if name not in arrays.files]
            if missing:
                raise ValueError(f"{FOREST_MODEL} lacks the array(s) {missing}")
            found = {name: arrays[name] for name in _ARRAYS}
        self.left, self.right = found["left"].astype(np.intp), found["right"].astype(np.intp)
        self.feature, self.threshold = found["feature"].astype(np.intp), found["threshold"]
        self.value, self.roots = found["value"], found["roots"].astype(np.intp)
        self.depth = int(found["depth"][0])
        nodes = len(self.left)
        if not (len(self.right) == len(self.feature) == len(self.threshold) == len(self.value) == nodes) or \
                self.value.ndim != 2 or not len(self.roots):
            raise ValueError(f"{FOREST_MODEL} is inconsistent: its node arrays differ in length or it has no tree")
        inner = self.left >= 0
        if np.any(self.left[inner] >= nodes) or np.any(self.right[inner] >= nodes) or np.any(self.right[inner] < 0) \
                or np.any(self.roots >= nodes) or np.any(self.roots < 0):
            raise ValueError(f"{FOREST_MODEL} is inconsistent: a node points outside the file")

    @property
    def n_features_needed(self) -> int:
        """The highest feature index an inner node reads, plus one."""
        inner = self.left >= 0
        return int(self.feature[inner].max()) + 1 if inner.any() else 0

    def check_features(self, count: int) -> None:
        """ValueError where the trees read a feature beyond ``count``."""
        if self.n_features_needed > count:
            raise ValueError(f"the forest reads feature {self.n_features_needed - 1}, but the card lists {count} "
                             "feature columns")

    @property
    def trees(self) -> int:
        return len(self.roots)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Rows x outputs: the mean of the trees' leaf values for each row (float32 features)."""
        rows = features.shape[0]
        out = np.empty((rows, self.value.shape[1]), dtype=np.float64)
        for start in range(0, rows, ROW_CHUNK):
            chunk = features[start: start + ROW_CHUNK]
            node = np.tile(self.roots, (len(chunk), 1))
            row = np.arange(len(chunk))[:, None]
            for _ in range(self.depth):
                left = self.left[node]
                inner = left >= 0
                if not inner.any():
                    break
                goes_left = chunk[row, self.feature[node]] <= self.threshold[node]
                node = np.where(inner, np.where(goes_left, left, self.right[node]), node)
            out[start: start + len(chunk)] = self.value[node].mean(axis=1)
        return out
