"""The tune stage's Ray-free parts: the search space, scaler maps, the leaderboard and its plot."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from airflow_ray_ml_stages import wine
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.preprocessor import Moments, Preprocessor, feature_affine
from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE, SearchSpace
from airflow_ray_ml_stages.specs import TuneSpec, resolve_train_config
from airflow_ray_ml_stages.train.config import FAMILIES
from airflow_ray_ml_stages.train.splits import scaler_plan
from airflow_ray_ml_stages.tune import leaderboard_csv, plot_leaderboard, sort_rows
from tests.conftest import requires_ml_extra

DATA = {"artifact_dir": "/tmp/a", "train_uri": "/d/train", "validation_uri": "/d/validation",
        "feature_columns": ["x1", "x2"], "label_column": "y", "preprocessor_uri": "/d/p.json"}


def test_default_space_spans_every_family_and_both_scalers_and_every_bound_trains():
    space = SearchSpace(DEFAULT_SEARCH_SPACE)
    assert space.families == list(FAMILIES) and space.scalers == ["standard", "minmax"]
    assert TuneSpec(**DATA).space().raw == DEFAULT_SEARCH_SPACE  # None means the default
    assert space.max_budget("xgboost") == DEFAULT_SEARCH_SPACE["xgboost"]["num_boost_round"]
    assert space.max_budget("extra_trees") == DEFAULT_SEARCH_SPACE["extra_trees"]["n_estimators"]


def test_space_to_ray_samples_configs_that_decode_to_one_familys_hyperparameters():
    from ray.tune.search.variant_generator import generate_variants

    space = SearchSpace(DEFAULT_SEARCH_SPACE)
    np.random.seed(3)
    seen = set()
    for _ in range(40):
        _, sampled = next(generate_variants(space.to_ray()))
        config = space.decode(sampled)
        family = config["family"]
        seen.add(family)
        block = DEFAULT_SEARCH_SPACE[family]
        assert set(config) - {"family", "scaler"} == set(block)  # its own hyperparameters, no other family's
        for name, value in block.items():
            kind, argument = next(iter(value.items())) if isinstance(value, dict) else ("fixed", value)
            if kind == "choice":
                assert config[name] in argument
            elif kind == "randint":  # high exclusive
                assert argument[0] <= config[name] < argument[1] and isinstance(config[name], int)
            elif kind in ("uniform", "loguniform"):
                assert argument[0] <= config[name] <= argument[1]
            else:
                assert config[name] == argument
        resolve_train_config(config)  # RayTrain accepts it, scaler and all
    assert seen == set(FAMILIES)


def test_space_to_ray_reads_a_range_high_first_and_one_with_equal_bounds_as_its_value():
    from ray.tune.search.variant_generator import generate_variants

    space = SearchSpace({"family": "xgboost", "xgboost": {
        "max_depth": {"randint": [9.0, 3]}, "eta": {"loguniform": [0.3, 0.02]},
        "subsample": {"uniform": [0.8, 0.8]}, "num_boost_round": {"randint": [50, 50]}}})
    ray_space = space.to_ray()["xgboost"]
    assert ray_space["subsample"] == 0.8 and ray_space["num_boost_round"] == 50  # fixed, not a domain
    np.random.seed(5)
    for _ in range(8):
        _, sampled = next(generate_variants(space.to_ray()))
        config = resolve_train_config(space.decode(sampled))
        assert 3 <= config["max_depth"] < 9 and 0.02 <= config["eta"] <= 0.3
        assert config["subsample"] == 0.8 and config["num_boost_round"] == 50


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"family": "sklearn"}, "search_space\\['family'\\] must be one of.*got 'sklearn'"),
        ({"scaler": {"choice": ["standard", "robust"]}}, "search_space\\['scaler'\\].*robust"),
        ({"lightning": {"hiden_sizes": [8]}}, "unknown hyperparameter.*hiden_sizes"),
        ({"lightning": {"lr": {"loguniform": [0, 1]}}}, "loguniform needs low > 0, got \\[0, 1\\]"),
        ({"lightning": {"lr": {"uniform": ["a", 1]}}}, "uniform needs \\[low, high\\] numbers, got \\['a', 1\\]"),
        ({"lightning": {"max_epochs": {"uniform": [1, 9]}}}, "takes integers; uniform and loguniform sample"),
        ({"lightning": {"max_epochs": {"randint": [1.5, 4]}}}, "randint needs integer bounds"),
        ({"lightning": {"dropout": {"choice": []}}}, "choice needs a non-empty list"),
        ({"lightning": {"dropout": {"choice": [0.1], "grid": [0.2]}}}, "exactly one of"),
        ({"lightning": {"dropout": {"uniform": [0.5, 1.5]}}}, "allows 1.5, which training rejects"),
        ({"xgboost": {"eta": 0.1}}, "block\\(s\\) \\['xgboost'\\] but 'family' only allows \\['lightning'\\]"),
        ({"catboost": {}}, "unknown key\\(s\\) \\['catboost'\\]"),
    ],
)
def test_bad_search_space_raises_quoting_the_value(space, message):
    with pytest.raises(SpecError, match=message):
        TuneSpec(**{**DATA, "search_space": space})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"searcher": "optuna", "search_space": {"lightning": {"lr": {"grid": [0.01, 0.02]}}}}, "cannot search grid"),
        ({"preprocessor_uri": None}, "asks for scaler\\(s\\) \\['standard', 'minmax'\\] but no preprocessor_uri"),
        ({"searcher": "bayes"}, "searcher must be one of.*got 'bayes'"),
        ({"scheduler": "pbt"}, "scheduler must be one of.*got 'pbt'"),
        ({"metric": "test_rmse"}, "metric must be one of.*got 'test_rmse'"),
        ({"num_samples": 0}, "num_samples must be an integer >= 1, got 0"),
        ({"cpus_per_trial": 0}, "cpus_per_trial must be a number > 0 or null, got 0"),
        ({"time_budget_s": -1}, "time_budget_s must be a number of seconds > 0 or null, got -1"),
        ({"preprocessor_variants": {"robust": "/x"}}, "preprocessor_variants must map scalers"),
    ],
)
def test_tune_spec_bad_value_raises_quoting_it(fields, message):
    with pytest.raises(SpecError, match=message):
        TuneSpec(**{**DATA, **fields})


def test_tune_spec_round_trips_and_takes_its_mode_from_the_metric():
    spec = TuneSpec(**{**DATA, "metric": "val_acc_0_5", "searcher": "optuna"})
    assert TuneSpec.from_json(spec.to_json()) == spec and spec.mode == "max"
    assert TuneSpec(**DATA).mode == "min"


@pytest.fixture
def fitted(tmp_path):
    frame = wine.generate(rows=500, seed=5)
    numeric = list(wine.FEATURES)
    moments = Moments.of(frame[numeric].to_numpy(dtype="float64"))
    make = {name: Preprocessor.fit(name, numeric, moments, {"type": ["red", "white"]}, "quality")
            for name in ("standard", "minmax", "none")}
    paths = {}
    for name, preprocessor in make.items():
        paths[name] = str(tmp_path / f"{name}.json")
        (tmp_path / f"{name}.json").write_text(preprocessor.to_json())
    return frame, make, paths


@pytest.mark.parametrize("target", ["minmax", "none", "standard"])
def test_feature_affine_maps_written_splits_to_another_scaler_exactly(fitted, target):
    frame, make, _ = fitted
    written = make["standard"].transform(frame)
    columns = list(written.columns)
    multiply, add = feature_affine(make["standard"], make[target], columns)
    mapped = written.to_numpy() * multiply + add
    np.testing.assert_allclose(mapped, make[target].transform(frame).to_numpy(), rtol=1e-10, atol=1e-10)
    assert np.all(multiply[-2:] == 1) and np.all(add[-2:] == 0)  # one-hot columns untouched


def test_scaler_plan_without_the_variant_says_how_to_fix_it(fitted):
    _, make, paths = fitted
    columns = make["standard"].output_columns
    assert scaler_plan(paths["standard"], None, "standard", columns) == (None, paths["standard"])
    assert scaler_plan(paths["standard"], None, None, columns) == (None, paths["standard"])
    affine, uri = scaler_plan(paths["standard"], paths, "minmax", columns)
    assert uri == paths["minmax"] and len(affine[0]) == len(columns)
    with pytest.raises(SpecError, match="asks for scaler 'minmax'.*written with 'standard'.*rerun the preprocess"):
        scaler_plan(paths["standard"], {"standard": paths["standard"]}, "minmax", columns)


def _row(trial_id, status, rmse=None, family="xgboost", error=None, end_s=None):
    metrics = None if rmse is None else {"val_rmse": rmse, "val_mae": rmse / 2, "val_acc_0_5": 0.5, "val_acc_1_0": 0.8}
    config = {"family": family, "scaler": "standard", **({"eta": 0.1} if family == "xgboost" else {"lr": 0.01})}
    return {"rank": 0, "trial_id": trial_id, "family": family, "scaler": "standard", "config": config,
            "metrics": metrics, "status": status, "iterations": 2, "time_s": 1.5, "error": error, "end_s": end_s}


@requires_ml_extra
def test_leaderboard_sorts_completed_then_early_stopped_then_failed():
    rows = [_row("a", "FAILED", error="XGBoostError: bad"), _row("b", "EARLY_STOPPED", 0.60),
            _row("c", "COMPLETED", 0.70, end_s=3.0), _row("d", "COMPLETED", 0.65, family="lightning", end_s=5.0),
            _row("e", "EARLY_STOPPED", None, error="stopped before its first report")]
    ranked = sort_rows(rows, "val_rmse", "min")
    assert [row["trial_id"] for row in ranked] == ["d", "c", "b", "e", "a"]
    assert [row["rank"] for row in ranked] == [1, 2, 3, 4, 5]
    assert [row["trial_id"] for row in sort_rows(rows, "val_rmse", "max")][:2] == ["c", "d"]

    table = list(csv.DictReader(io.StringIO(leaderboard_csv(ranked))))
    assert [row["trial_id"] for row in table] == ["d", "c", "b", "e", "a"]
    assert table[0]["config.lr"] == "0.01" and table[0]["config.eta"] == "" and table[1]["config.eta"] == "0.1"
    assert float(table[0]["val_rmse"]) == 0.65 and table[4]["error"] == "XGBoostError: bad"

    png = plot_leaderboard(ranked, {"c": [(1.0, 0.8), (3.0, 0.7)], "d": [(2.0, 0.9), (5.0, 0.65)], "b": [(2.5, 0.6)]},
                           "val_rmse", "min", "test")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_default_search_space_narrows_to_the_chosen_families_and_sets_budgets():
    from airflow_ray_ml_stages.search_space import SearchSpace, default_search_space

    space = default_search_space(["xgboost"], ["minmax", "standard"], max_epochs=3, num_boost_round=25)
    assert space["family"] == "xgboost" and "lightning" not in space
    assert space["scaler"] == {"choice": ["minmax", "standard"]}
    assert space["xgboost"]["num_boost_round"] == 25
    assert SearchSpace(space).families == ["xgboost"]
    both = default_search_space(None, ["none"], max_epochs=3)
    assert both["family"] == {"choice": list(FAMILIES)} and both["lightning"]["max_epochs"] == 3
    assert both["scaler"] == "none"
    with pytest.raises(SpecError, match=r"families may hold .*got \['svm'\]"):
        default_search_space(["svm"])


def test_default_start_configs_are_points_of_the_space_that_decode_back_to_them():
    """The random search runs XGBoost's library defaults and the two forests first; they decode to the configs given."""
    from airflow_ray_ml_stages.search_space import DEFAULT_START_CONFIGS

    spec = TuneSpec(**DATA)
    points = spec.start_points()
    assert [point["family"] for point in points] == ["xgboost", "extra_trees", "random_forest", "linear"]
    space = spec.space()
    for point, start in zip(points, DEFAULT_START_CONFIGS):
        assert point["scaler"] == space.scalers[0]
        decoded = space.decode(point)
        assert decoded == {**start, "scaler": space.scalers[0]}
        resolve_train_config(decoded)
    # Ray Tune takes a point's keys only where the space has them: a start config's keys that the space does
    # not search (the forests' max_depth) are placeholders there, which a sampled config leaves out.
    from ray.tune.search.variant_generator import _get_preset_variants, generate_variants

    param_space = space.to_ray(points)
    forest = next(point for point in points if point["family"] == "extra_trees")
    assert "max_depth" not in DEFAULT_SEARCH_SPACE["extra_trees"]
    _, preset = next(_get_preset_variants({"config": param_space}, forest))
    assert space.decode(preset["config"])["max_depth"] == 0
    np.random.seed(1)
    for _ in range(10):
        _, sampled = next(generate_variants(param_space))
        decoded = space.decode(sampled)
        assert decoded["family"] == "xgboost" or "max_depth" not in decoded
    # none where the space cannot pick XGBoost, none for Optuna or a grid space, none when told, at most num_samples
    assert TuneSpec(**{**DATA, "search_space": {"family": "lightning"}, "preprocessor_uri": None}).start_points() == []
    assert TuneSpec(**{**DATA, "searcher": "optuna"}).start_points() == []
    assert TuneSpec(**{**DATA, "start_configs": []}).start_points() == []
    assert TuneSpec(**{**DATA, "search_space": {"family": "xgboost", "xgboost": {"max_depth": {"grid": [2, 4]}}},
                       "preprocessor_uri": None}).start_points() == []
    assert len(TuneSpec(**{**DATA, "num_samples": 1}).start_points()) == 1


def test_a_start_config_with_a_list_choice_is_searched_by_its_index():
    spec = TuneSpec(**{**DATA, "start_configs": [{"family": "lightning", "hidden_sizes": [128, 64], "lr": 0.5}]})
    (point,) = spec.start_points()
    options = DEFAULT_SEARCH_SPACE["lightning"]["hidden_sizes"]["choice"]
    assert point["lightning"]["hidden_sizes"] == options.index([128, 64])
    assert spec.space().decode(point) == {"family": "lightning", "scaler": "standard", "hidden_sizes": [128, 64],
                                          "lr": 0.5}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start_configs": {"family": "xgboost"}}, "start_configs must be a list of train configs"),
        ({"start_configs": [{"family": "xgboost"}], "searcher": "optuna"}, "are run by searchers 'adaptive' and 'random'"),
        ({"start_configs": [{"family": "xgboost"}], "search_space": {"family": "lightning"}, "preprocessor_uri": None},
         "start_configs\\[0\\] has family 'xgboost', which the search space does not pick"),
        ({"start_configs": [{"family": "xgboost", "scaler": "none"}]}, "scaler 'none'; the search space's scalers"),
        ({"start_configs": [{"family": "xgboost", "eta": 2}]}, "start_configs\\[0\\]: .*eta"),
        ({"start_configs": [{"family": "lightning", "hidden_sizes": [7]}]}, "must be one of the search space's choices"),
        ({"start_configs": ["xgboost"]}, "start_configs\\[0\\] must be a JSON object"),
    ],
)
def test_bad_start_config_raises_naming_it(fields, message):
    with pytest.raises(SpecError, match=message):
        TuneSpec(**{**DATA, **fields})


def test_ensemble_selection_averages_trials_whose_errors_differ_and_keeps_a_trial_no_average_beats():
    from airflow_ray_ml_stages.ensemble import select_ensemble

    rng = np.random.default_rng(0)
    labels = rng.normal(size=2000)
    one, other = labels + rng.normal(scale=0.5, size=2000), labels + rng.normal(scale=0.5, size=2000)
    worse = labels + rng.normal(scale=2.0, size=2000)
    chosen = select_ensemble(labels, {"a": one, "b": other, "c": worse}, "regression", "rmse", "min")
    weights = dict(chosen.weights)
    assert set(weights) >= {"a", "b"} and sum(weights.values()) == pytest.approx(1)
    assert 0.3 < weights["a"] < 0.7 and weights.get("c", 0) < 0.2
    best_alone = min(np.sqrt(np.mean((p - labels) ** 2)) for p in (one, other))
    averaged = sum(weight * {"a": one, "b": other, "c": worse}[name] for name, weight in chosen.weights)
    assert chosen.metrics["rmse"] == pytest.approx(np.sqrt(np.mean((averaged - labels) ** 2)))
    assert chosen.metrics["rmse"] < best_alone * 0.8
    # a trial that is right on every row: no average beats it, so it stays alone
    alone = select_ensemble(labels, {"exact": labels + 1e-9, "a": one, "b": other}, "regression", "rmse", "min")
    assert alone.weights == [("exact", 1.0)] and alone.rounds == 1
    # classification averages probabilities, by a metric to maximise as well
    classes = rng.integers(0, 3, size=600)
    def noisy(seed):
        logits = np.eye(3)[classes] * 2 + np.random.default_rng(seed).normal(size=(600, 3))
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    for metric, mode in (("log_loss", "min"), ("accuracy", "max")):
        found = select_ensemble(classes, {"x": noisy(1), "y": noisy(2)}, "classification", metric, mode)
        assert len(found.weights) == 2, metric


def test_selection_chooses_among_the_trials_near_the_best_by_loss_or_by_shortfall_from_one():
    from airflow_ray_ml_stages.ensemble import library

    log_losses = {"linear": 0.076, "xgboost": 0.0786, "forest": 0.159, "lightning": 0.11}
    assert library(log_losses, "min") == ["linear", "xgboost", "lightning"]  # the forest is twice the best's loss
    accuracies = {"a": 0.96, "b": 0.95, "c": 0.93}  # shortfalls 0.04, 0.05, 0.07
    assert library(accuracies, "max") == ["a", "b"]
    assert library({"only": 0.0, "other": 1e-9}, "min") == ["only"]  # a perfect trial stays alone


def test_an_ensemble_gain_that_is_noise_fails_on_held_out_halves_and_a_real_one_holds():
    """Thirty copies of one trial with noise of their own: greedy selection on 40 rows finds averages that
    fit those rows, which do worse than the trial alone on rows they were not chosen on."""
    from airflow_ray_ml_stages.ensemble import HOLDOUT_MIN_ROWS, HOLDOUT_TOLERANCE, holdout_ratio, select_ensemble

    spurious, real = [], []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        labels = rng.normal(size=40)
        best = labels + rng.normal(size=40)
        copies = {"best": best, **{f"copy{k}": best + rng.normal(scale=2.0, size=40) for k in range(30)}}
        assert len(select_ensemble(labels, copies, "regression", "rmse", "min").weights) > 1  # on all rows: a gain
        spurious.append(holdout_ratio(labels, copies, "regression", "rmse", "min", seed=seed))
        # errors that differ: the average's gain is real
        apart = {name: labels + rng.normal(scale=scale, size=40) for name, scale in (("a", 1.0), ("b", 1.0), ("c", 1.2))}
        real.append(holdout_ratio(labels, apart, "regression", "rmse", "min", seed=seed))
    assert sum(ratio > HOLDOUT_TOLERANCE for ratio in spurious) >= 8, spurious
    assert max(real) < 1.0, real
    # a metric to maximise reads the same way round: classifiers whose errors differ vote better together
    classes = np.random.default_rng(0).integers(0, 3, size=600)
    voters = {f"v{seed}": np.eye(3)[classes] + np.random.default_rng(seed).normal(size=(600, 3)) for seed in range(5)}
    voters = {name: np.exp(v) / np.exp(v).sum(axis=1, keepdims=True) for name, v in voters.items()}
    assert holdout_ratio(classes, voters, "classification", "accuracy", "max") < 0.95
    # too few rows are not halved
    assert holdout_ratio(labels[: HOLDOUT_MIN_ROWS - 1], {"a": labels[: HOLDOUT_MIN_ROWS - 1]}, "regression", "rmse",
                         "min") is None


@pytest.mark.parametrize(("members", "message"), [
    ([], "needs 'members': a non-empty list"),
    ([{"model_dir": "/m/0", "weight": 0}], r"members\[0\].weight must be a number > 0, got 0"),
    ([{"model_dir": "", "weight": 1}], r"members\[0\].model_dir must be a model directory's URI"),
    ([{"model_dir": "/m/0", "weight": 1, "family": "ensemble"}], "an ensemble does not nest"),
    ([{"model_dir": "/m/0", "weight": 1, "path": "/x"}], r"members\[0\] must be an object of"),
])
def test_ensemble_config_refuses_bad_members_naming_them(members, message):
    with pytest.raises(SpecError, match=message):
        resolve_train_config({"family": "ensemble", "members": members})
    config = resolve_train_config({"family": "ensemble", "members": [{"model_dir": "/m/0", "weight": 3},
                                                                     {"model_dir": "/m/1", "weight": 1}]})
    assert [member["weight"] for member in config["members"]] == [0.75, 0.25]


def test_describe_members_names_each_trial_once_with_its_folds_weights_summed():
    from airflow_ray_ml_stages.ensemble import describe_members

    folds = [{"trial_id": "a1", "family": "xgboost", "weight": 0.15, "fold": fold} for fold in range(5)]
    members = [*folds, {"trial_id": "b2", "family": "linear", "weight": 0.25}, {"family": "linear", "weight": 0.0}]
    assert describe_members(members) == "a1 (xgboost, 5 folds) x 0.75, b2 (linear) x 0.25, member 6 (linear) x 0.00"


def test_progress_line_counts_ended_failed_running_and_to_come_and_names_the_best_so_far():
    from types import SimpleNamespace

    from airflow_ray_ml_stages.constants import TUNE_PROGRESS_MARKER
    from airflow_ray_ml_stages.tune import progress_line

    def trial(trial_id, status, value=None):  # what the line reads of Tune's Trial
        return SimpleNamespace(trial_id=trial_id, status=status,
                               last_result={} if value is None else {"val_rmse": value, "training_iteration": 3})

    trials = [trial("a_00000", "TERMINATED", 0.81), trial("a_00001", "ERROR"), trial("a_00002", "RUNNING", 0.74),
              trial("a_00003", "RUNNING"), trial("a_00004", "PENDING")]
    line = progress_line(trials, 12, "val_rmse", "min")
    assert line == (f"{TUNE_PROGRESS_MARKER}2 of 12 trials ended (1 failed), 2 running, 8 to come; "
                    "best val_rmse so far 0.74 (trial a_00002)")
    # accuracy-like metrics: the largest is the best; before any result there is no best
    assert progress_line(trials, 5, "val_rmse", "max").endswith("best val_rmse so far 0.81 (trial a_00000)")
    assert progress_line([trial("b", "PENDING")], 1, "val_rmse", "min") == \
        f"{TUNE_PROGRESS_MARKER}0 of 1 trials ended, 0 running, 1 to come"
