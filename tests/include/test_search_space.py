"""The search space's JSON Schema and SearchSpace agree: what a run's trigger accepts, the search_space task accepts.

The schema is what the wine DAG's ``search_space`` Param checks when a run is triggered; SearchSpace is
what the DAG's task and the tune stage check. No Ray, no Airflow: the DAG's example is read from its source.
"""

from __future__ import annotations

import ast
import copy
import random

import jsonschema
import pytest

from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE, SearchSpace, search_space_json_schema
from airflow_ray_ml_stages.train.config import HYPERPARAMETER_CONSTRAINTS, LIGHTNING_DEFAULTS, XGBOOST_DEFAULTS
from tests.conftest import ROOT

SCHEMA = search_space_json_schema()
DRAFT_7 = jsonschema.Draft7Validator(SCHEMA)


def _dag_example() -> dict:
    """SEARCH_SPACE_EXAMPLE as the wine DAG's source writes it (the DAG module imports Airflow)."""
    tree = ast.parse((ROOT / "dags" / "wine_quality_pipeline.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SEARCH_SPACE_EXAMPLE"]:
            return ast.literal_eval(node.value)
    raise AssertionError("the wine DAG has no SEARCH_SPACE_EXAMPLE")


def _schema_accepts(space, validator=None) -> bool:
    """As the trigger checks a Param (``jsonschema.validate``, or ``validator`` built from the same
    schema); draft 7 must read the schema the same way as 2020-12."""
    try:
        if validator is None:
            jsonschema.validate(space, SCHEMA, format_checker=jsonschema.FormatChecker())
        else:
            validator.validate(space)
    except jsonschema.ValidationError:
        accepted = False
    else:
        accepted = True
    assert DRAFT_7.is_valid(space) is accepted, space
    return accepted


def _search_space_accepts(space) -> bool:
    try:
        SearchSpace(space)
    except SpecError:
        return False
    return True


GOOD = [
    DEFAULT_SEARCH_SPACE,
    _dag_example(),
    {"lightning": {"dropout": {"uniform": [0.3, 0.0]}, "lr": {"loguniform": [3e-2, 1e-3]}}},  # high first
    {"family": "xgboost", "xgboost": {"max_depth": {"randint": [11, 3]}, "eta": {"uniform": [0.3, 0.3]}}},
    {"lightning": {"batch_size": {"randint": [64, 64]}, "max_epochs": {"randint": [5.0, 2]}}},  # equal; 5.0 is 5
    {"family": {"choice": ["xgboost"]}, "xgboost": {"gamma": {"choice": ["any", 1]}, "seed": 3,
                                                    "reg_lambda": {"loguniform": [10, 0.1]}}},
    {"family": {"grid": ["lightning", "xgboost"]}, "scaler": "none",
     "lightning": {"hidden_sizes": {"grid": [[8], [16, 8]]}, "patience": 0}, "xgboost": {}},
    {"lightning": {"hidden_sizes": [8, 4], "max_epochs": 3.0, "dropout": 0, "lr": 0}},
]

BAD = [
    # lightning, each constraint
    {"lightning": {"dropout": 1.5}},
    {"lightning": {"dropout": 1}},
    {"lightning": {"dropout": {"uniform": [0.5, 1.0]}}},
    {"lightning": {"lr": -0.1}},
    {"lightning": {"lr": {"uniform": ["a", 1]}}},
    {"lightning": {"weight_decay": {"choice": [1e-4, -1]}}},
    {"lightning": {"hidden_sizes": []}},
    {"lightning": {"hidden_sizes": [64, 0]}},
    {"lightning": {"hidden_sizes": {"choice": [[64], [1.5]]}}},
    {"lightning": {"hidden_sizes": {"randint": [1, 4]}}},
    {"lightning": {"batch_size": 0}},
    {"lightning": {"batch_size": {"grid": [32, 64.5]}}},
    {"lightning": {"max_epochs": True}},
    {"lightning": {"max_epochs": {"uniform": [1, 9]}}},  # would sample fractions
    {"lightning": {"patience": -1}},
    {"lightning": {"patience": {"randint": [-1, 3]}}},
    {"lightning": {"hiden_sizes": [8]}},
    # xgboost, each constraint
    {"family": "xgboost", "xgboost": {"eta": {"loguniform": [0, 0.3]}}},
    {"family": "xgboost", "xgboost": {"eta": 0}},
    {"family": "xgboost", "xgboost": {"subsample": {"uniform": [0.5, 1.5]}}},
    {"family": "xgboost", "xgboost": {"colsample_bytree": "all"}},
    {"family": "xgboost", "xgboost": {"max_depth": -1}},
    {"family": "xgboost", "xgboost": {"max_depth": {"randint": [2.5, 8]}}},
    {"family": "xgboost", "xgboost": {"num_boost_round": 0}},
    {"family": "xgboost", "xgboost": {"early_stopping_rounds": {"choice": [10, None]}}},
    {"family": "xgboost", "xgboost": {"gamma": {"loguniform": [-1, 1]}}},
    {"family": "xgboost", "xgboost": {"gamma": {"uniform": [0, float("inf")]}}},
    {"family": "xgboost", "xgboost": {"scaler": "standard"}},
    # each domain's shape
    {"lightning": {"lr": {"choice": []}}},
    {"lightning": {"lr": {"grid": 0.1}}},
    {"lightning": {"lr": {"uniform": [0.1]}}},
    {"lightning": {"lr": {"uniform": [0.1, 0.2, 0.3]}}},
    {"lightning": {"lr": {"loguniform": "wide"}}},
    {"lightning": {"lr": {"choice": [0.1], "grid": [0.2]}}},
    {"family": "xgboost", "xgboost": {"gamma": {"choice": [1], "note": "x"}}},
    {"family": "xgboost", "xgboost": {"gamma": {"randint": [True, 4]}}},
    # the top
    {"family": "catboost"},
    {"family": {"choice": []}},
    {"family": {"uniform": [0, 1]}},
    {"scaler": {"choice": ["standard", "robust"]}},
    {"scaler": None},
    {"xgboost": {"eta": 0.1}},  # no family: Lightning's only
    {"family": "xgboost", "lightning": {}},
    {"lightning": [1]},
    {"catboost": {}},
]


def test_schema_is_valid_for_draft_7_and_2020_12():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    # what Airflow's Param checks it with: draft 7, whose metaschema check costs a fifth (bench/bench_params.py)
    assert jsonschema.validators.validator_for(SCHEMA) is jsonschema.Draft7Validator
    assert set(HYPERPARAMETER_CONSTRAINTS["lightning"]) == set(LIGHTNING_DEFAULTS)
    assert set(HYPERPARAMETER_CONSTRAINTS["xgboost"]) <= set(XGBOOST_DEFAULTS)


@pytest.mark.parametrize("space", GOOD)
def test_good_spaces_pass_the_schema_and_search_space(space):
    assert _schema_accepts(space) and _search_space_accepts(space)


@pytest.mark.parametrize("space", BAD)
def test_bad_spaces_are_refused_by_the_schema_as_by_search_space(space):
    assert not _search_space_accepts(space)
    assert not _schema_accepts(space)


def test_reversed_and_equal_ranges_read_as_low_first_and_as_the_value():
    space = SearchSpace({"family": "xgboost", "xgboost": {
        "max_depth": {"randint": [11, 3]}, "eta": {"uniform": [0.3, 0.3]}, "num_boost_round": {"randint": [50, 50]}}})
    assert space.max_budget("xgboost") == 50
    with pytest.raises(SpecError, match="allows 0, which training rejects"):
        SearchSpace({"family": "xgboost", "xgboost": {"eta": {"uniform": [0.3, 0]}}})


def _random_space(rng: random.Random) -> dict:
    numbers = [-1, 0, 1e-3, 0.3, 0.5, 1, 1.0, 1.5, 2, 3, 5.0, 64, True, None, "a", float("inf")]
    fixed = [*numbers, [], [8], [8, 4], [0], [2.5], {}, {"lr": 1}]

    def value():
        roll = rng.random()
        if roll < 0.3:
            return rng.choice(fixed)
        kind = rng.choice(["choice", "grid", "uniform", "loguniform", "randint"])
        if roll < 0.9:
            argument = [rng.choice(numbers), rng.choice(numbers)]
        else:
            argument = rng.choice([[], [rng.choice(fixed)], [rng.choice(fixed) for _ in range(3)], 0.5])
        domain = {kind: argument}
        if rng.random() < 0.05:
            domain["grid"] = [1]
        return domain

    families = rng.choice([None, "lightning", "xgboost", {"choice": ["lightning", "xgboost"]}, {"grid": ["xgboost"]},
                           "catboost", {"choice": []}])
    space: dict = {} if families is None else {"family": families}
    if rng.random() < 0.3:
        space["scaler"] = rng.choice(["standard", "none", "robust", {"choice": ["minmax"]}])
    for family, names in (("lightning", [*LIGHTNING_DEFAULTS, "hiden"]),
                          ("xgboost", [*XGBOOST_DEFAULTS, "gamma", "seed", "family"])):
        if rng.random() < 0.6:
            space[family] = {name: value() for name in rng.sample(names, rng.randint(1, 2))}
    return space


def test_random_spaces_the_schema_accepts_search_space_accepts():
    # jsonschema.validate checks the schema itself on every call; once is enough here
    validator = jsonschema.validators.validator_for(SCHEMA)(SCHEMA, format_checker=jsonschema.FormatChecker())
    rng = random.Random(7)
    outcomes = {True: 0, False: 0}
    for _ in range(1500):
        space = _random_space(rng)
        accepted = _schema_accepts(copy.deepcopy(space), validator)
        outcomes[accepted] += 1
        if accepted:
            assert _search_space_accepts(space), space
    assert min(outcomes.values()) > 50, outcomes  # both outcomes well exercised
