"""The train stage's model config: each family's hyperparameter defaults, and their validation.

:func:`resolve_train_config` is what TrainSpec, the tune stage's trials and the search space
(:mod:`airflow_ray_ml_stages.search_space`) all check a config with, so they accept and reject the same configs.
Each hyperparameter's check is stated once, in :data:`HYPERPARAMETER_CONSTRAINTS`; the search space's
JSON Schema (what a run's trigger checks) is written from the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_ray_ml_stages.constants import SCALERS
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.spec_base import require_choice

FAMILIES = ("lightning", "xgboost", "extra_trees", "random_forest", "linear")
FORESTS = ("extra_trees", "random_forest")
"""The scikit-learn forest families, saved as plain arrays (``models.forest``)."""
SKLEARN_FAMILIES = (*FORESTS, "linear")
"""The scikit-learn families: trained in the job's (or the trial's) one process, on CPU."""

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

EXTRA_TREES_DEFAULTS: dict[str, Any] = {
    "n_estimators": 100,
    "max_features": 1.0,
    "min_samples_leaf": 1,
    "max_depth": 0,
}
"""scikit-learn's ExtraTrees: ``max_features`` is the share of the features each split considers
(1.0: all, scikit-learn's regression default); ``max_depth`` 0 grows each tree until its leaves
hold ``min_samples_leaf`` rows."""

RANDOM_FOREST_DEFAULTS: dict[str, Any] = {**EXTRA_TREES_DEFAULTS, "max_features": 0.5}
"""scikit-learn's random forest (bootstrap row samples), each split over half of the features."""

LINEAR_DEFAULTS: dict[str, Any] = {"alpha": 1.0}
"""A linear model: ridge regression, or (classification) logistic regression with ``C = 1 / alpha``;
``alpha`` is the L2 penalty's strength."""

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "lightning": LIGHTNING_DEFAULTS, "xgboost": XGBOOST_DEFAULTS,
    "extra_trees": EXTRA_TREES_DEFAULTS, "random_forest": RANDOM_FOREST_DEFAULTS, "linear": LINEAR_DEFAULTS,
}
"""Each family's defaults: every hyperparameter it takes (XGBoost takes more, see below)."""

ENSEMBLE = "ensemble"
"""The family of a model that averages trained trials (``airflow_ray_ml_stages.ensemble``): never
searched, it is what the tune stage's ensemble selection gives the train stage to assemble."""
ENSEMBLE_MEMBER_KEYS = ("model_dir", "weight", "trial_id", "family", "scaler", "config", "validation", "fold")
"""What an ensemble's member may record: its model directory and weight, and the trial (and the
cross-validation fold, ``TuneSpec.cv_folds``) that trained it."""

BUDGET_KEYS = {"lightning": "max_epochs", "xgboost": "num_boost_round", **{forest: "n_estimators" for forest in FORESTS}}
"""The hyperparameter that sets a family's training length (ASHA's budget is a share of it): epochs,
boosting rounds, or a forest's trees (a forest reports only its end, so ASHA never cuts one). The
linear model has none: it trains in one go."""


def training_length(family: str, config: dict[str, Any]) -> int:
    """Epochs, rounds or trees of a resolved config; 1 for the linear model (one fit)."""
    return int(config[BUDGET_KEYS[family]]) if family in BUDGET_KEYS else 1

OPEN_FAMILIES = ("xgboost",)
"""Families that take hyperparameters beyond their defaults' (the booster's many parameters, unchecked)."""

@dataclass(frozen=True)
class Constraint:
    """What one hyperparameter takes: a number or integer (or a non-empty list of them) within bounds.

    The one statement of each check: :func:`resolve_train_config` applies it, and the search
    space's JSON Schema (what a run's trigger checks) is written from it.
    """

    kind: str  # "number" or "integer"
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None
    is_list: bool = False  # a non-empty list of such values

    def _item_ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        # JSON has one number type, so 3.0 is the integer 3 (as JSON Schema reads it too)
        if self.kind == "integer" and not (isinstance(value, int) or value.is_integer()):
            return False
        return not ((self.minimum is not None and value < self.minimum)
                    or (self.exclusive_minimum is not None and value <= self.exclusive_minimum)
                    or (self.maximum is not None and value > self.maximum)
                    or (self.exclusive_maximum is not None and value >= self.exclusive_maximum))

    def accepts(self, value: Any) -> bool:
        if self.is_list:
            return isinstance(value, list) and bool(value) and all(self._item_ok(item) for item in value)
        return self._item_ok(value)

    def normalize(self, value: Any) -> Any:
        """An accepted value with integers as ``int`` (what the trainers expect)."""
        if self.kind != "integer":
            return value
        return [int(item) for item in value] if self.is_list else int(value)

    def describe(self) -> str:
        """E.g. ``a number in (0, 1]``, ``an integer >= 1``, ``a non-empty list of integers >= 1``."""
        noun = "integer" if self.kind == "integer" else "number"
        low = self.minimum if self.minimum is not None else self.exclusive_minimum
        high = self.maximum if self.maximum is not None else self.exclusive_maximum
        if low is not None and high is not None:
            bounds = (f"in {'[' if self.minimum is not None else '('}{low:g}, {high:g}"
                      f"{']' if self.maximum is not None else ')'}")
        elif low is not None:
            bounds = f"{'>=' if self.minimum is not None else '>'} {low:g}"
        elif high is not None:
            bounds = f"{'<=' if self.maximum is not None else '<'} {high:g}"
        else:
            bounds = ""
        if self.is_list:
            return f"a non-empty list of {noun}s {bounds}".rstrip()
        return f"{'an' if noun == 'integer' else 'a'} {noun} {bounds}".rstrip()

    def json_schema(self) -> dict[str, Any]:
        item: dict[str, Any] = {"type": self.kind}
        for key, bound in (("minimum", self.minimum), ("exclusiveMinimum", self.exclusive_minimum),
                           ("maximum", self.maximum), ("exclusiveMaximum", self.exclusive_maximum)):
            if bound is not None:
                item[key] = bound
        return {"type": "array", "minItems": 1, "items": item} if self.is_list else item


_FRACTION = Constraint("number", exclusive_minimum=0, maximum=1)
HYPERPARAMETER_CONSTRAINTS: dict[str, dict[str, Constraint]] = {
    "lightning": {
        "hidden_sizes": Constraint("integer", minimum=1, is_list=True),
        "dropout": Constraint("number", minimum=0, exclusive_maximum=1),
        "lr": Constraint("number", minimum=0),
        "weight_decay": Constraint("number", minimum=0),
        "batch_size": Constraint("integer", minimum=1),
        "max_epochs": Constraint("integer", minimum=1),
        "patience": Constraint("integer", minimum=0),
    },
    "xgboost": {
        "max_depth": Constraint("integer", minimum=0),
        "num_boost_round": Constraint("integer", minimum=1),
        "early_stopping_rounds": Constraint("integer", minimum=0),
        "eta": _FRACTION,
        "subsample": _FRACTION,
        "colsample_bytree": _FRACTION,
    },
    **{forest: {
        "n_estimators": Constraint("integer", minimum=1, maximum=5000),
        "max_features": _FRACTION,
        "min_samples_leaf": Constraint("integer", minimum=1),
        "max_depth": Constraint("integer", minimum=0),
    } for forest in FORESTS},
    "linear": {"alpha": Constraint("number", exclusive_minimum=0)},
}
"""Each family's checked hyperparameters; every one of Lightning's and the forests' is listed, and
XGBoost's others (its booster takes many) go to the booster unchecked."""


# Keys a config may carry besides hyperparameters: RayTune's best config has its own bookkeeping,
# and its ``scaler`` (which preprocessor variant the features use) is handled by the train stage.
_CONFIG_IGNORED = ("family", "seed", "trial_id", "score", "scaler")


def resolve_train_config(config: dict[str, Any]) -> dict[str, Any]:
    """Merge a (possibly partial) config over the family's defaults; raise SpecError on a bad one."""
    if not isinstance(config, dict):
        raise SpecError(f"TrainSpec.config must be a JSON object, got {config!r}")
    family = config.get("family", "lightning")
    if family == ENSEMBLE:
        return resolve_ensemble_config(config)
    require_choice("TrainSpec", "config['family']", family, FAMILIES)
    if "scaler" in config:
        require_choice("TrainSpec", "config['scaler']", config["scaler"], SCALERS)
    defaults = FAMILY_DEFAULTS[family]
    unknown = sorted(set(config) - set(defaults) - set(_CONFIG_IGNORED))
    if unknown and family not in OPEN_FAMILIES:
        raise SpecError(
            f"TrainSpec.config has unknown {family} hyperparameter(s) {unknown}; known: {sorted(defaults)}"
        )
    resolved = {**defaults, **{k: v for k, v in config.items() if k not in _CONFIG_IGNORED}, "family": family}
    # Unknown XGBoost keys go to the booster as they are (XGBoost has many); the ones we use are checked.
    for name, constraint in HYPERPARAMETER_CONSTRAINTS[family].items():
        if not constraint.accepts(resolved[name]):
            raise SpecError(f"TrainSpec.config[{name!r}] must be {constraint.describe()}, got {resolved[name]!r}")
        resolved[name] = constraint.normalize(resolved[name])
    return resolved


def resolve_ensemble_config(config: dict[str, Any]) -> dict[str, Any]:
    """An ensemble's config checked: ``members``, each a trained model directory and its weight (> 0).

    The weights come back as shares (summing to 1); each member keeps what the tune stage recorded of
    it (``trial_id``, ``family``, ``scaler``, ``config``, ``validation`` metrics).
    """
    where = "TrainSpec.config (family 'ensemble')"
    unknown = sorted(set(config) - {"family", "members", *_CONFIG_IGNORED})
    if unknown:
        raise SpecError(f"{where} takes 'members' only, got {unknown}")
    members = config.get("members")
    if not isinstance(members, list) or not members:
        raise SpecError(f"{where} needs 'members': a non-empty list of {{'model_dir': <a trained model directory>, "
                        f"'weight': <a number > 0>}}, got {members!r}")
    checked = []
    for index, member in enumerate(members):
        if not isinstance(member, dict) or sorted(set(member) - set(ENSEMBLE_MEMBER_KEYS)):
            raise SpecError(f"{where}: members[{index}] must be an object of {list(ENSEMBLE_MEMBER_KEYS)}, got {member!r}")
        directory, weight = member.get("model_dir"), member.get("weight")
        if not isinstance(directory, str) or not directory.strip():
            raise SpecError(f"{where}: members[{index}].model_dir must be a model directory's URI, got {directory!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            raise SpecError(f"{where}: members[{index}].weight must be a number > 0, got {weight!r}")
        if member.get("family", "lightning") not in FAMILIES:
            raise SpecError(f"{where}: members[{index}].family must be one of {list(FAMILIES)} (an ensemble does not "
                            f"nest), got {member.get('family')!r}")
        checked.append(dict(member))
    total = sum(float(member["weight"]) for member in checked)
    for member in checked:
        member["weight"] = float(member["weight"]) / total
    return {"family": ENSEMBLE, "members": checked}
