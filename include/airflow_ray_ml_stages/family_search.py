"""The ``adaptive`` searcher: random hyperparameters, each trial's family drawn from the results so far.

A random search over several families spends its trials evenly on them: with 12 trials and five
families, the family that fits the table best gets two or three, most of them on a model that
cannot win. This searcher runs the start configs first (Ray Tune's ``points_to_evaluate`` as the
random search runs them), then one trial of each family no trial has tried yet, and then draws
each trial's family by rank: the family of the best completed result is drawn with weight 1, the
next best with weight ``1/3``, then ``1/9``, and so on (a family with no completed result yet
ranks last), so about two thirds of the rest go to the family that is winning and every family
keeps a chance. The family's hyperparameters and the scaler are sampled from the space as
the random search samples them, from the seeded generator. A failed trial counts as no result.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from ray.tune.search import Searcher
from ray.tune.search.sample import Domain

RANK_WEIGHT = 1 / 3
"""Each family's draw weight is this to the power of its rank (0: the family of the best result)."""


class AdaptiveFamilySearch(Searcher):
    """Ray Tune ``Searcher`` over :meth:`SearchSpace.to_ray`'s space (``family`` at its top, one block
    of hyperparameters per family); ``points``: the start points, run first, in order."""

    def __init__(self, families: list[str], points: list[dict[str, Any]] | None = None, seed: int = 0) -> None:
        super().__init__()
        self._families = list(families)
        self._points = [copy.deepcopy(point) for point in points or []]
        self._rng = np.random.default_rng(seed)
        self._space: dict[str, Any] | None = None
        self._family_of: dict[str, str] = {}
        self._best: dict[str, float] = {}  # family -> best score, lower is better

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        self._space = copy.deepcopy(config)
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self._space is None:
            raise RuntimeError("AdaptiveFamilySearch needs the search space (Tuner's param_space) before suggest")
        config = self._sample(self._space)
        if self._points:
            point = self._points.pop(0)
            for key, value in point.items():
                if isinstance(value, dict):
                    config.setdefault(key, {}).update(value)
                else:
                    config[key] = value
        else:
            config["family"] = self.next_family()
        self._family_of[trial_id] = config["family"]
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        family = self._family_of.get(trial_id)
        if error or not result or family is None or self._metric not in result:
            return
        value = float(result[self._metric])
        if not np.isfinite(value):
            return
        score = value if self._mode == "min" else -value
        self._best[family] = min(score, self._best.get(family, np.inf))

    def next_family(self) -> str:
        """An untried family (in the space's order), else one drawn by the rank of its best result."""
        tried = set(self._family_of.values())
        for family in self._families:
            if family not in tried:
                return family
        ranked = sorted(self._families, key=lambda family: (self._best.get(family, np.inf), self._families.index(family)))
        weights = np.array([RANK_WEIGHT ** rank for rank in range(len(ranked))])
        return ranked[int(self._rng.choice(len(ranked), p=weights / weights.sum()))]

    def _sample(self, value: Any) -> Any:
        """``value`` with every Ray Tune domain in it sampled from the seeded generator."""
        if isinstance(value, Domain):
            return value.sample(random_state=self._rng)
        if isinstance(value, dict):
            return {key: self._sample(item) for key, item in value.items()}
        return copy.deepcopy(value)
