"""The tuning search space: JSON-able domains over model family, scaler and each family's hyperparameters.

A search space is a JSON object::

    {
      "family": {"choice": ["lightning", "xgboost"]},
      "scaler": {"choice": ["standard", "minmax"]},
      "lightning": {"lr": {"loguniform": [1e-3, 3e-2]}, "hidden_sizes": {"choice": [[64, 32], [128, 64]]},
                    "max_epochs": 30},
      "xgboost": {"max_depth": {"randint": [3, 11]}, "eta": {"loguniform": [0.02, 0.3]}}
    }

Each value is a fixed value or one domain: ``{"choice": [...]}``, ``{"uniform": [low, high]}``,
``{"loguniform": [low, high]}`` (low > 0), ``{"randint": [low, high]}`` (integers, high
exclusive, as Ray Tune's) or ``{"grid": [...]}`` (every value is tried; random search only).
A range given high first is the same range low first, and a range whose bounds are equal is that
one value (``{"randint": [4, 4]}`` is 4). ``uniform`` and ``loguniform`` sample fractions, so an
integer hyperparameter takes ``randint``, ``choice`` or ``grid``. Every option, and each range's
bounds, must be a value training accepts
(:data:`~airflow_ray_ml_stages.train.config.HYPERPARAMETER_CONSTRAINTS`).
``family`` and ``scaler`` may be fixed strings. Each family's block holds only its own
hyperparameters; a trial of one family never sees the other's, and the best config carries only
its own. Hyperparameters a block does not name take the train stage's defaults.
:func:`search_space_json_schema` states the same rules as a JSON Schema, so a form can refuse a
bad space before a run starts.

Ray Tune (and Optuna) see the same nesting (Ray flattens it to keys such as ``xgboost/eta``), so
each trial samples every block and uses its family's; choices whose options are not plain scalars
(``hidden_sizes`` lists) are searched as indices and decoded per trial, as Optuna's categorical
distribution takes scalars only. Nothing here imports Ray.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from airflow_ray_ml_stages.constants import SCALERS
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.spec_base import is_number
from airflow_ray_ml_stages.train.config import (
    BUDGET_KEYS,
    EXTRA_TREES_DEFAULTS,
    FAMILIES,
    FAMILY_DEFAULTS,
    HYPERPARAMETER_CONSTRAINTS,
    LINEAR_DEFAULTS,
    OPEN_FAMILIES,
    RANDOM_FOREST_DEFAULTS,
    resolve_train_config,
)

DOMAINS = ("choice", "uniform", "loguniform", "randint", "grid")
FIXED = "value"
"""The kind :func:`_domain` gives a range whose bounds are equal: that one value."""

DEFAULT_SEARCH_SPACE: dict[str, Any] = {
    "family": {"choice": list(FAMILIES)},
    "scaler": {"choice": ["standard", "minmax"]},
    "lightning": {
        "hidden_sizes": {"choice": [[32, 16], [64, 32], [128, 64], [128, 64, 32]]},
        "dropout": {"uniform": [0.0, 0.3]},
        "lr": {"loguniform": [1e-3, 3e-2]},
        "weight_decay": {"loguniform": [1e-6, 1e-3]},
        "batch_size": {"choice": [64, 128, 256]},
        "max_epochs": 40,
        "patience": 4,
    },
    "xgboost": {
        "max_depth": {"randint": [2, 13]},
        "eta": {"loguniform": [0.02, 0.15]},
        "subsample": {"uniform": [0.6, 1.0]},
        "colsample_bytree": {"uniform": [0.5, 1.0]},
        "min_child_weight": {"loguniform": [0.5, 20.0]},
        "reg_lambda": {"loguniform": [0.5, 20.0]},
        "num_boost_round": 1000,
        "early_stopping_rounds": 50,
    },
    "extra_trees": {
        "max_features": {"uniform": [0.3, 1.0]},
        "min_samples_leaf": {"randint": [1, 6]},
        "n_estimators": 100,
    },
    "random_forest": {
        "max_features": {"uniform": [0.2, 0.8]},
        "min_samples_leaf": {"randint": [1, 6]},
        "n_estimators": 100,
    },
    "linear": {"alpha": {"loguniform": [1e-3, 100.0]}},
}
"""The default: every family, both scalers, each family's main hyperparameters."""

DEFAULT_START_CONFIGS: list[dict[str, Any]] = [
    # XGBoost with its library's own defaults (with the space's rounds and early stopping)
    {"family": "xgboost", "eta": 0.3, "max_depth": 6, "subsample": 1.0, "colsample_bytree": 1.0,
     "min_child_weight": 1.0, "reg_lambda": 1.0},
    # the two forests with their defaults (ExtraTrees as scikit-learn grows it for regression)
    {"family": "extra_trees", **EXTRA_TREES_DEFAULTS},
    {"family": "random_forest", **RANDOM_FOREST_DEFAULTS},
    # ridge / logistic regression with scikit-learn's default penalty
    {"family": "linear", **LINEAR_DEFAULTS},
]
"""The configs a random search tries first (TuneSpec's ``start_configs`` default): the plain tree
ensembles a search has to beat, so the champion is chosen against them on the same validation rows.
A config of a family the space cannot pick is left out."""


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _domain(where: str, value: Any) -> tuple[str, Any] | None:
    """``(kind, argument)`` of a domain, None for a fixed value; SpecError quoting a bad one.

    A range comes back low first (randint's bounds as ints); one whose bounds are equal comes back
    as ``(FIXED, bound)``.
    """
    if not (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in DOMAINS):
        if isinstance(value, dict) and set(value) & set(DOMAINS):
            raise SpecError(f"search_space{where} must hold exactly one of {list(DOMAINS)}, got {value!r}")
        return None
    kind, argument = next(iter(value.items()))
    if kind in ("choice", "grid"):
        if not isinstance(argument, list) or not argument:
            raise SpecError(f"search_space{where}: {kind} needs a non-empty list of options, got {argument!r}")
        return kind, argument
    if not (isinstance(argument, list) and len(argument) == 2 and all(is_number(x) for x in argument)):
        raise SpecError(f"search_space{where}: {kind} needs [low, high] numbers, got {argument!r}")
    # A form's schema cannot compare the two bounds, so their order is read rather than refused.
    low, high = sorted(argument)
    if kind == "loguniform" and low <= 0:
        raise SpecError(f"search_space{where}: loguniform needs low > 0, got {argument!r}")
    if kind == "randint":
        # JSON has one number type: 3.0 is the integer 3, as JSON Schema reads it too
        if not all(isinstance(x, int) or float(x).is_integer() for x in argument):
            raise SpecError(f"search_space{where}: randint needs integer bounds [low, high), got {argument!r}")
        low, high = int(low), int(high)
    if low == high:
        return FIXED, low
    return kind, [low, high]


def _options(where: str, value: Any) -> list[Any]:
    """Every value a domain (or fixed value) can take that matters for validation: options, or bounds."""
    domain = _domain(where, value)
    if domain is None:
        return [value]
    kind, argument = domain
    if kind == FIXED:
        return [argument]
    if kind == "randint":
        return [argument[0], argument[1] - 1]
    return list(argument)


class SearchSpace:
    """A validated search space; :meth:`to_ray` gives Ray Tune's flat ``param_space``."""

    def __init__(self, raw: dict[str, Any]) -> None:
        if not isinstance(raw, dict):
            raise SpecError(f"search_space must be a JSON object, got {raw!r}")
        unknown = sorted(set(raw) - {"family", "scaler", *FAMILIES})
        if unknown:
            raise SpecError(f"search_space has unknown key(s) {unknown}; it takes 'family', 'scaler' and one "
                            f"block per family {list(FAMILIES)}")
        self.raw = copy.deepcopy(raw)
        self.families = self._top("family", FAMILIES, "lightning")
        self.scalers = self._top("scaler", SCALERS, None)
        unused = sorted(set(raw) & set(FAMILIES) - set(self.families))
        if unused:
            raise SpecError(f"search_space has block(s) {unused} but 'family' only allows {self.families}; "
                            f"add them to the family choice or drop the block(s)")
        self.blocks: dict[str, dict[str, Any]] = {}
        for family in self.families:
            block = raw.get(family, {})
            if not isinstance(block, dict):
                raise SpecError(f"search_space[{family!r}] must be an object of hyperparameters, got {block!r}")
            self.blocks[family] = block
            self._check_block(family, block)
        self.has_grid = any(self._kind(value) == "grid" for value in self._flat_values().values())

    def _kind(self, value: Any) -> str | None:
        domain = _domain("", value)
        return domain[0] if domain else None

    def _top(self, key: str, allowed: tuple[str, ...], default: str | None) -> list[Any]:
        if key not in self.raw and default is None:
            return [None]
        value = self.raw.get(key, default)
        options = _options(f"[{key!r}]", value)
        bad = [option for option in options if option not in allowed]
        if bad or self._kind(value) in ("uniform", "loguniform", "randint"):
            raise SpecError(f"search_space[{key!r}] must be one of {list(allowed)} or a choice/grid of them, "
                            f"got {value!r}")
        return options

    def _check_block(self, family: str, block: dict[str, Any]) -> None:
        if family not in OPEN_FAMILIES:
            unknown = sorted(set(block) - set(FAMILY_DEFAULTS[family]))
            if unknown:
                raise SpecError(f"search_space[{family!r}] has unknown hyperparameter(s) {unknown}; known: "
                                f"{sorted(FAMILY_DEFAULTS[family])}")
        elif "family" in block or "scaler" in block:
            raise SpecError(f"search_space[{family!r}] must not set 'family' or 'scaler'; set them at the top")
        # Every option (and each range's bounds) must be a config the train stage accepts.
        for name, value in block.items():
            options = _options(f"[{family!r}][{name!r}]", value)
            constraint = HYPERPARAMETER_CONSTRAINTS[family].get(name)
            if constraint and constraint.kind == "integer" and self._kind(value) is not None \
                    and next(iter(value)) in ("uniform", "loguniform"):
                # every trial would get a fraction, which training refuses
                raise SpecError(f"search_space[{family!r}][{name!r}] takes integers; uniform and loguniform "
                                f"sample fractions, so give it a randint, choice or grid, got {value!r}")
            for option in options:
                try:
                    resolve_train_config({"family": family, name: option})
                except SpecError as err:
                    raise SpecError(f"search_space[{family!r}][{name!r}] allows {option!r}, which training "
                                    f"rejects: {err}") from None

    def _flat_values(self) -> dict[str, Any]:
        flat = {"family": self.raw.get("family", "lightning")}
        if "scaler" in self.raw:
            flat["scaler"] = self.raw["scaler"]
        for family, block in self.blocks.items():
            for name, value in block.items():
                flat[f"{family}.{name}"] = value
        return flat

    @staticmethod
    def _ray_domain(value: Any) -> Any:
        from ray import tune

        domain = _domain("", value)
        if domain is None:
            return value
        kind, argument = domain
        if kind == FIXED:
            return argument
        if kind in ("choice", "grid"):
            options = argument if all(_is_scalar(x) for x in argument) else list(range(len(argument)))
            return tune.choice(options) if kind == "choice" else tune.grid_search(options)
        return getattr(tune, kind)(*argument)

    def to_ray(self, points: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Ray Tune's ``param_space``; non-scalar choices as indices (decoded by :meth:`decode`).

        ``points``: the :meth:`start_point` s the searcher runs first. Ray Tune takes only a point's
        keys that the space has, so a hyperparameter a start config sets and the block does not
        name is added as None, which :meth:`decode` leaves out of sampled configs.
        """
        space: dict[str, Any] = {"family": self._ray_domain(self.raw.get("family", "lightning"))}
        if "scaler" in self.raw:
            space["scaler"] = self._ray_domain(self.raw["scaler"])
        for family, block in self.blocks.items():
            names = {name: self._ray_domain(value) for name, value in block.items()}
            for point in points or []:
                names.update({name: None for name in point.get(family, {}) if name not in block})
            if names:
                space[family] = names
        return space

    def decode(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """A trial's config: ``family``, ``scaler`` (when the space names one) and its family's hyperparameters."""
        family = sampled["family"]
        config: dict[str, Any] = {"family": family}
        if sampled.get("scaler") is not None:
            config["scaler"] = sampled["scaler"]
        for name, value in (sampled.get(family) or {}).items():
            # a start config may set hyperparameters the block does not name: they come as given
            if name not in self.blocks[family] and value is None:
                continue  # to_ray's placeholder in a sampled config
            domain = _domain("", self.blocks[family].get(name))
            if domain and domain[0] in ("choice", "grid") and not all(_is_scalar(x) for x in domain[1]):
                value = domain[1][int(value)]
            config[name] = _plain(value)
        return config

    def start_point(self, config: dict[str, Any], where: str = "start config") -> dict[str, Any]:
        """A train config (family, optional scaler, hyperparameters) as a point of :meth:`to_ray`'s space.

        What Ray Tune's ``points_to_evaluate`` takes: the searcher runs it before sampling, and
        :meth:`decode` gives the config back. Hyperparameters it does not name are sampled as usual; a
        choice of lists (``hidden_sizes``) must be given one of its options. SpecError names what to fix.
        """
        if not isinstance(config, dict):
            raise SpecError(f"{where} must be a JSON object of family, scaler and hyperparameters, got {config!r}")
        family = config.get("family", "lightning")
        if family not in self.families:
            raise SpecError(f"{where} has family {family!r}, which the search space does not pick (it picks "
                            f"{self.families}); add it to the space's family choice or drop the config")
        scaler = config.get("scaler", self.scalers[0])
        if scaler not in self.scalers:
            raise SpecError(f"{where} has scaler {scaler!r}; the search space's scalers are {self.scalers}")
        try:
            resolve_train_config({key: value for key, value in config.items() if key != "scaler"})
        except SpecError as err:
            raise SpecError(f"{where}: {err}") from None
        block = {}
        for name, value in config.items():
            if name in ("family", "scaler"):
                continue
            domain = _domain("", self.blocks[family].get(name))
            if domain and domain[0] in ("choice", "grid") and not all(_is_scalar(x) for x in domain[1]):
                if value not in domain[1]:
                    raise SpecError(f"{where}: {name} {value!r} must be one of the search space's choices "
                                    f"{domain[1]}")
                value = domain[1].index(value)
            block[name] = value
        point: dict[str, Any] = {"family": family}
        if scaler is not None:
            point["scaler"] = scaler
        if block:
            point[family] = block
        return point

    def max_budget(self, family: str) -> int:
        """The most epochs (lightning), rounds (xgboost) or trees (a forest) a trial of ``family`` can run."""
        if family not in BUDGET_KEYS:
            return 1  # the linear model: one fit
        key = BUDGET_KEYS[family]
        value = self.blocks.get(family, {}).get(key, FAMILY_DEFAULTS[family][key])
        return int(max(_options("", value)))


def _plain(value: Any) -> Any:
    """numpy scalars (what samplers return) as plain JSON numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        return value.item()
    return value


def default_search_space(
    families: list[str] | None = None,
    scalers: list[str] | None = None,
    max_epochs: int | None = None,
    num_boost_round: int | None = None,
) -> dict[str, Any]:
    """The default search space narrowed to ``families`` and ``scalers``, with the training budgets set.

    What the wine DAG's Params form builds: a family or scaler given alone is fixed rather than a
    one-option choice; the result is validated like any user's space.
    """
    space = copy.deepcopy(DEFAULT_SEARCH_SPACE)
    families = list(families or FAMILIES)
    scalers = list(scalers or space["scaler"]["choice"])
    for name, chosen, allowed in (("families", families, FAMILIES), ("scalers", scalers, SCALERS)):
        wrong = [value for value in chosen if value not in allowed]
        if wrong:
            raise SpecError(f"{name} may hold {list(allowed)}, got {wrong}")
    space["family"] = families[0] if len(families) == 1 else {"choice": families}
    space["scaler"] = scalers[0] if len(scalers) == 1 else {"choice": scalers}
    for family in FAMILIES:
        if family not in families:
            space.pop(family)
    if max_epochs is not None and "lightning" in space:
        space["lightning"]["max_epochs"] = int(max_epochs)
    if num_boost_round is not None and "xgboost" in space:
        space["xgboost"]["num_boost_round"] = int(num_boost_round)
    SearchSpace(space)
    return space


def _value_schema(constraint: dict[str, Any], integer: bool) -> dict[str, Any]:
    """A hyperparameter's value: fixed and matching ``constraint`` (a JSON Schema), or one domain of such values.

    ``integer``: an integer hyperparameter, which takes no uniform or loguniform (they sample fractions).
    """
    listed = {"type": "array", "minItems": 1, "items": constraint}
    domains: dict[str, Any] = {"choice": listed, "grid": listed}
    if constraint.get("type") != "array":  # a list-valued hyperparameter has no range
        # A bound is a finite number (SearchSpace refuses infinity) matching the constraint, whichever
        # bound is the low one: SearchSpace reads a reversed range.
        bound = {"type": "number", **constraint}
        if "minimum" not in bound and "exclusiveMinimum" not in bound:
            bound["minimum"] = -sys.float_info.max
        if "maximum" not in bound and "exclusiveMaximum" not in bound:
            bound["maximum"] = sys.float_info.max
        pair = {"type": "array", "minItems": 2, "maxItems": 2}
        domains["randint"] = {**pair, "items": {**bound, "type": "integer"}}
        if not integer:
            positive = max(constraint.get("exclusiveMinimum", 0), 0)
            domains["uniform"] = {**pair, "items": bound}
            domains["loguniform"] = {**pair, "items": {**bound, "exclusiveMinimum": positive}}
    fixed = constraint
    if "type" not in constraint:  # anything, but an object naming a domain is read as that domain
        fixed = {**constraint, "not": {"type": "object", "anyOf": [{"required": [kind]} for kind in DOMAINS]}}
    return {"anyOf": [fixed, {"type": "object", "minProperties": 1, "maxProperties": 1,
                              "additionalProperties": False, "properties": domains}]}


JSON_SCHEMA_DRAFT = "http://json-schema.org/draft-07/schema#"


def search_space_json_schema() -> dict[str, Any]:
    """A JSON Schema that takes the spaces :class:`SearchSpace` takes, for forms that check input before a run.

    It states :class:`SearchSpace`'s rules: ``family`` and ``scaler`` as a name or a
    ``choice``/``grid`` of names, a block only for a family the space can pick, the known
    hyperparameters (all of Lightning's, XGBoost's checked ones) each a fixed value or a domain
    whose options and bounds match :data:`HYPERPARAMETER_CONSTRAINTS`. Whether a range's low is
    below its high is beyond JSON Schema; :class:`SearchSpace` reads either order. Written with
    keywords draft 7 and 2020-12 read alike, and declared draft 7.
    """
    def names(allowed: tuple[Any, ...]) -> dict[str, Any]:
        name = {"enum": list(allowed)}
        listed = {"type": "array", "minItems": 1, "items": name}
        return {"oneOf": [name, {"type": "object", "additionalProperties": False, "minProperties": 1,
                                 "maxProperties": 1, "properties": {"choice": listed, "grid": listed}}]}

    def includes(family: str) -> dict[str, Any]:
        """``family`` is a name that is ``family``, or a choice/grid that has it."""
        has = {"contains": {"const": family}}
        return {"anyOf": [{"const": family}, {"type": "object", "properties": {"choice": has, "grid": has}}]}

    def block(family: str) -> dict[str, Any]:
        constraints = HYPERPARAMETER_CONSTRAINTS[family]
        properties = {name: _value_schema(constraints[name].json_schema(), constraints[name].kind == "integer")
                      if name in constraints else _value_schema({}, integer=False) for name in FAMILY_DEFAULTS[family]}
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if family not in OPEN_FAMILIES:
            schema["additionalProperties"] = False  # Lightning and the forests take only their own hyperparameters
        else:
            # the booster takes parameters beyond the checked ones, as any value or domain
            schema["additionalProperties"] = _value_schema({}, integer=False)
            schema["propertyNames"] = {"not": {"enum": ["family", "scaler"]}}
        return schema

    # a block needs its family among the space's; a space without 'family' is Lightning's
    uses_its_family = [
        {"if": {"required": [family]},
         "then": {"properties": {"family": includes(family)}, **({} if family == "lightning" else
                                                                 {"required": ["family"]})}}
        for family in FAMILIES
    ]
    return {
        # Declared draft 7, which reads it as 2020-12 does: a validator checks the schema itself on
        # every call (Airflow's Param does, each time a DAG's params are serialized or compared),
        # and against draft 7's metaschema that check takes a fifth of the time.
        "$schema": JSON_SCHEMA_DRAFT,
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "family": names(FAMILIES),
            "scaler": names(tuple(SCALERS)),
            **{family: block(family) for family in FAMILIES},
        },
        "allOf": uses_its_family,
    }
