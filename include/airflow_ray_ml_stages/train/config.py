"""The train stage's model config: each family's hyperparameter defaults, and their validation.

:func:`resolve_train_config` is what TrainSpec, the tune stage's trials and the search space
(:mod:`airflow_ray_ml_stages.search_space`) all check a config with, so they accept and reject the same configs.
"""

from __future__ import annotations

from typing import Any

from airflow_ray_ml_stages.constants import SCALERS
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.spec_base import require_choice, require_int_range

FAMILIES = ("lightning", "xgboost")

LIGHTNING_DEFAULTS: dict[str, Any] = {
    "hidden_sizes": [64, 32],
    "dropout": 0.1,
    "lr": 3e-3,
    "weight_decay": 1e-4,
    "batch_size": 128,
    "max_epochs": 30,
    "patience": 5,
}
"""Lightning MLP hyperparameters used where the config does not name them."""

XGBOOST_DEFAULTS: dict[str, Any] = {
    "max_depth": 6,
    "eta": 0.1,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "min_child_weight": 1.0,
    "reg_lambda": 1.0,
    "num_boost_round": 200,
    "early_stopping_rounds": 20,
}
"""XGBoost booster parameters used where the config does not name them."""

# Keys a config may carry besides hyperparameters: RayTune's best config has its own bookkeeping,
# and its ``scaler`` (which preprocessor variant the features use) is handled by the train stage.
_CONFIG_IGNORED = ("family", "seed", "trial_id", "score", "scaler")


def resolve_train_config(config: dict[str, Any]) -> dict[str, Any]:
    """Merge a (possibly partial) config over the family's defaults; raise SpecError on a bad one."""
    if not isinstance(config, dict):
        raise SpecError(f"TrainSpec.config must be a JSON object, got {config!r}")
    family = config.get("family", "lightning")
    require_choice("TrainSpec", "config['family']", family, FAMILIES)
    if "scaler" in config:
        require_choice("TrainSpec", "config['scaler']", config["scaler"], SCALERS)
    defaults = LIGHTNING_DEFAULTS if family == "lightning" else XGBOOST_DEFAULTS
    unknown = sorted(set(config) - set(defaults) - set(_CONFIG_IGNORED))
    if unknown and family == "lightning":
        raise SpecError(
            f"TrainSpec.config has unknown lightning hyperparameter(s) {unknown}; known: {sorted(defaults)}"
        )
    resolved = {**defaults, **{k: v for k, v in config.items() if k not in _CONFIG_IGNORED}, "family": family}
    owner = "TrainSpec.config"
    if family == "lightning":
        sizes = resolved["hidden_sizes"]
        if not isinstance(sizes, list) or not sizes or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
        ):
            raise SpecError(f"{owner}['hidden_sizes'] must be a non-empty list of positive integers, got {sizes!r}")
        for name in ("lr", "weight_decay", "dropout"):
            value = resolved[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SpecError(f"{owner}[{name!r}] must be a number >= 0, got {value!r}")
        if resolved["dropout"] >= 1:
            raise SpecError(f"{owner}['dropout'] must be below 1, got {resolved['dropout']!r}")
        for name in ("batch_size", "max_epochs"):
            require_int_range(owner, repr(name), resolved[name], 1)
        require_int_range(owner, "'patience'", resolved["patience"], 0)
    else:
        # Unknown keys go to the booster as they are (XGBoost has many); the ones we use are checked.
        require_int_range(owner, "'max_depth'", resolved["max_depth"], 0)
        require_int_range(owner, "'num_boost_round'", resolved["num_boost_round"], 1)
        require_int_range(owner, "'early_stopping_rounds'", resolved["early_stopping_rounds"], 0)
        for name in ("eta", "subsample", "colsample_bytree"):
            value = resolved[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise SpecError(f"{owner}[{name!r}] must be a number in (0, 1], got {value!r}")
    return resolved
