"""The adaptive searcher: start configs first, then every family once, then mostly the winning family."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("ray.tune", reason="the searcher is a Ray Tune Searcher (the `ml` extra's ray[tune])")

from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE, DEFAULT_START_CONFIGS, SearchSpace  # noqa: E402
from airflow_ray_ml_stages.specs import resolve_train_config  # noqa: E402

from airflow_ray_ml_stages.family_search import AdaptiveFamilySearch  # noqa: E402

SPACE = SearchSpace(DEFAULT_SEARCH_SPACE)
POINTS = [SPACE.start_point(config) for config in DEFAULT_START_CONFIGS]


def _searcher(seed: int = 0, mode: str = "min") -> AdaptiveFamilySearch:
    searcher = AdaptiveFamilySearch(SPACE.families, POINTS, seed)
    assert searcher.set_search_properties("val_metric", mode, SPACE.to_ray(POINTS))
    return searcher


def _run(searcher: AdaptiveFamilySearch, scores: dict[str, float], trials: int, failing: str | None = None
         ) -> list[dict]:
    """``trials`` suggestions, each completed at once with its family's score (``failing``'s trials fail)."""
    configs = []
    for index in range(trials):
        config = SPACE.decode(searcher.suggest(str(index)))
        configs.append(config)
        if config["family"] == failing:
            searcher.on_trial_complete(str(index), None, error=True)
        else:
            searcher.on_trial_complete(str(index), {"val_metric": scores[config["family"]]})
    return configs


def test_start_configs_run_first_then_each_untried_family_then_the_best_family_most():
    scores = {"xgboost": 3.0, "extra_trees": 1.0, "random_forest": 2.0, "linear": 5.0, "lightning": 4.0}
    configs = _run(_searcher(), scores, 60)
    for config, start in zip(configs, DEFAULT_START_CONFIGS):  # the space's fixed values (XGBoost's rounds) added
        assert {**start, "scaler": "standard"}.items() <= config.items()
    assert configs[4]["family"] == "lightning"  # the one family no start config has
    for config in configs:
        resolve_train_config(config)  # each sampled config trains
    drawn = Counter(config["family"] for config in configs[5:])
    # the weights 1, 1/3, 1/9, ...: about 2/3 to the best family, then about a fifth to the next
    assert drawn["extra_trees"] > 0.5 * 55
    assert drawn["random_forest"] > drawn["xgboost"] and drawn["random_forest"] > drawn["linear"]
    hyperparameters = {config["max_features"] for config in configs[5:] if config["family"] == "extra_trees"}
    assert len(hyperparameters) == drawn["extra_trees"]  # sampled afresh each time


def test_a_metric_to_maximise_and_failed_trials_rank_a_family_as_they_should():
    scores = {"xgboost": 0.9, "extra_trees": 0.5, "random_forest": 0.6, "linear": 0.7, "lightning": 0.99}
    drawn = Counter(config["family"] for config in _run(_searcher(mode="max"), scores, 60, failing="lightning")[5:])
    # lightning's trials all fail: it ranks last, though its score would be the best
    assert drawn.most_common(1)[0][0] == "xgboost" and drawn["lightning"] < drawn["linear"]


def test_the_same_seed_suggests_the_same_trials_and_another_seed_others():
    scores = {"xgboost": 1.0, "extra_trees": 2.0, "random_forest": 3.0, "linear": 4.0, "lightning": 5.0}
    assert _run(_searcher(7), scores, 20) == _run(_searcher(7), scores, 20)
    assert _run(_searcher(7), scores, 20)[5:] != _run(_searcher(8), scores, 20)[5:]
