"""Benchmark: the default search's champion against plain models and an AutoML library, table by table.

Does the search earn its time? On the same split of the same table, this prints

- the **champion**: the wine DAG's default search as the DAG runs it (``default_search_space`` from
  the DAG's Param defaults, its default trials, time budget and searcher, ASHA, the ensemble of
  trials where it wins), then the train stage with the best config, scored on the test split (the
  train manifest's test metrics). Both stages are Ray jobs submitted to a local cluster this bench
  starts, with the per-trial resources the probe plans for that cluster, timed from submit to the manifest;
- the **plain peers**, library defaults, each fitted on the training and validation rows together
  (what the search had to learn from) and scored on the same test rows: scikit-learn's ExtraTrees
  (500 trees), random forest, HistGradientBoosting and a linear model (ridge, or logistic
  regression), and XGBoost;
- **FLAML** (``flaml.AutoML``, the ``bench`` extra) given the champion's wall time (tune + train) on
  the same CPUs, on the same rows (missing values imputed: some of its learners refuse NaN);
- the **peers' blend bound**: the best convex blend of the peers' test predictions, its weights
  fitted on the test rows themselves (:func:`blend_bound`). No model, only a measure of the room
  the goal's margin asks for: how far below the best peer any mix of these models reaches.

The features are the data stage's output, written exactly as the DAG's preprocess task writes them
(``run_preprocess`` with the DAG's spec, missing values imputed: the trees and FLAML take the
splits' NaN as they are, the linear model and FLAML the preprocessor's fill).

Metrics: regression RMSE, MAE and the share of predictions within 0.5 of the label; classification
accuracy, macro F1 and log loss; one line per metric says whether the champion is at least as good
as the best peer ("within 0.5" counts only for a graded label, see ``GRADED_MAX_VALUES``). The
goal (the summary): on the task's metric (RMSE, log loss) the champion ÷ the best peer is at most
1.00 on every table with at least 300 test rows, and at most 0.98 in the geometric mean over all
tables. With ``--group-column`` (the wine colour: ``type``) the same metrics per group follow. The
exit status is 0 either way; ``--check`` makes it 1 when the goal fails.

Usage::

    python bench/bench_quality.py                       # the generated wine data (as the demo DAG)
    python bench/bench_quality.py --tables wine diabetes breast_cancer digits wine_cultivars
    python bench/bench_quality.py --tables wine --table /data/cars.csv:price --table /data/loans.csv:defaulted:classification
    python bench/bench_quality.py --source a.csv [b.csv ...] --label COL [--task regression|classification]
                                  [--group-column COL] [--num-trials N] [--time-budget-s S] [--split-seed N [N ...]] [--check]

The real tables of ``--tables`` are the ones scikit-learn ships (no download): ``load_diabetes``,
``load_breast_cancer``, ``load_wine`` and ``load_digits``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

import airflow_ray_ml_stages  # noqa: E402
from airflow_ray_ml_stages.constants import JOB_ENV_VARS  # noqa: E402
from airflow_ray_ml_stages.ensemble import describe_members  # noqa: E402
from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402
from tests.child import run_python  # noqa: E402
from airflow_ray_ml_stages.metrics import DEFAULT_METRIC, regression_metrics  # noqa: E402

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
CLUSTER_CPUS = 2  # what `make run` gives the demo on this project's 2-CPU machines
GOAL_METRICS = {"regression": {"rmse": "min", "mae": "min", "acc_0_5": "max"},
                "classification": {"accuracy": "max", "macro_f1": "max", "log_loss": "min"}}
GRADED_MAX_VALUES = 20
"""A regression label is graded (a score such as wine quality, 3 to 9) when it takes whole values only, at most
this many of them. Only then is "within 0.5" (the share rounded to the right grade) part of the goal: on a
continuous label, or counts spanning hundreds of values, a hit within 0.5 is chance."""


def graded(labels: np.ndarray) -> bool:
    values = np.unique(np.asarray(labels, np.float64))
    return bool(np.all(values == np.round(values))) and len(values) <= GRADED_MAX_VALUES
DAG_PARAMS = ("families", "scalers", "num_trials", "searcher", "time_budget_s", "max_epochs", "num_boost_round",
              "label_column")
# The DAG's own module, read in a fresh process (Airflow's import is slow and writes into its home):
# its Param defaults are what a default run searches with, so the bench never restates them.
_READ_DAG_PARAMS = f"""
import sys
sys.path[:0] = [{str(ROOT / 'dags')!r}, {str(ROOT)!r}]
import wine_quality_pipeline as module
params = module.dag.params
report({{name: params[name] for name in {list(DAG_PARAMS)!r}}})
"""


def dag_defaults(work: Path) -> dict:
    """The wine DAG's Param defaults that set its search (families, scalers, trials, budget, ...)."""
    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow-home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
    return run_python(_READ_DAG_PARAMS, env=env).result


# -- data ----------------------------------------------------------------------------------------


BUILT_IN_TABLES = {
    # name: (scikit-learn's loader, its arguments, task); real tables it ships, read without a download
    "diabetes": ("load_diabetes", {"scaled": False}, "regression"),
    "breast_cancer": ("load_breast_cancer", {}, "classification"),
    "wine_cultivars": ("load_wine", {}, "classification"),
    "digits": ("load_digits", {}, "classification"),
}
"""Real public tables for ``--tables`` besides ``wine`` (the generated demo table) and your own files."""


def built_in_table(work: Path, name: str) -> tuple[list[str], str, str]:
    """A scikit-learn table written as CSV: its path, label column and task."""
    from sklearn import datasets

    loader, arguments, task = BUILT_IN_TABLES[name]
    frame = getattr(datasets, loader)(as_frame=True, **arguments).frame
    path = work / f"{name}.csv"
    frame.to_csv(path, index=False)
    return [str(path)], "target", task


def preprocess(work: Path, args, label: str, source: list[str] | None, task: str, seed: int | None) -> dict:
    """The data stage's manifest, run in this process with the spec the DAG's preprocess task builds."""
    from airflow_ray_ml_stages.data.stage import run_preprocess
    from airflow_ray_ml_stages.specs import GenerateSpec, PreprocessSpec
    from airflow_ray_ml_stages.wine import QUALITY_RANGE

    if source:
        source, label_range = [str(Path(path).resolve()) for path in source], None
    else:  # the DAG's demo_data task: the generated table in the UCI layout, graded 0-10
        from airflow_ray_ml_stages.generate import run_generate

        generated = run_generate(GenerateSpec(artifact_dir=str(work / "demo_data"), rows=args.rows, seed=args.demo_seed))
        source, label_range = generated.data_uris, list(QUALITY_RANGE)
    fields = {"artifact_dir": str(work / "preprocess"), "source": source, "label_column": label,
              "scaler": args.scalers[0], "label_range": label_range}
    if seed is not None:
        fields["seed"] = seed
    if task == "classification":
        fields["task"] = "classification"
        fields["label_threshold"] = args.label_threshold
    return run_preprocess(PreprocessSpec(**fields)).to_dict()


def read_split(data: dict, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's features and labels as the train stage reads them (same reader, same row order)."""
    from airflow_ray_ml_stages.train.splits import ParquetSplit

    features, label = data["feature_columns"], data["label_column"]
    table = ParquetSplit(data["split_uris"][split], [*features, label]).to_table(columns=[*features, label])
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in features])
    return x, table.column(label).to_numpy(zero_copy_only=False)


def test_groups(data: dict, column: str) -> np.ndarray:
    """Each test row's value of ``column`` (a feature), decoded from the written features."""
    import pandas as pd

    from airflow_ray_ml_stages.preprocessor import Preprocessor, inverse_transform
    from airflow_ray_ml_stages.train.splits import ParquetSplit

    preprocessor = Preprocessor.load(data["preprocessor_uri"])
    if column not in (*preprocessor.numeric_columns, *preprocessor.categories):
        raise SystemExit(f"--group-column {column!r} is not a feature of the data; features: "
                         f"{[*preprocessor.numeric_columns, *preprocessor.categories]}")
    features = data["feature_columns"]
    table = ParquetSplit(data["split_uris"]["test"], features).to_table(columns=features)
    raw = inverse_transform(preprocessor, pd.DataFrame({c: table.column(c).to_numpy() for c in features}))
    values = raw[column].to_numpy()
    if column in preprocessor.numeric_columns:
        values = np.round(values.astype(np.float64), 6)  # undo the scaling's rounding noise
    return values.astype(str)


# -- the champion: the DAG's tune and train tasks as Ray jobs ----------------------------------------


def submit(client, module: str, spec: dict) -> tuple[float, dict]:
    """Run a stage as its operator does (a Ray job with the package and JOB_ENV_VARS); seconds to the manifest."""
    manifest = Path(spec["artifact_dir"]) / "manifest.json"
    started = time.monotonic()
    job = client.submit_job(
        entrypoint=f"python -m {module} --spec {shlex.quote(json.dumps(spec))}",
        runtime_env={"py_modules": [str(Path(airflow_ray_ml_stages.__file__).parent)], "env_vars": dict(JOB_ENV_VARS)},
    )
    asked, status = 0.0, None
    while not manifest.exists():
        if time.monotonic() - asked > 0.5:  # the Jobs API costs the head's CPU, shared with the job
            asked, status = time.monotonic(), client.get_job_status(job)
            if status in TERMINAL:
                break
        time.sleep(0.05)
    seconds = time.monotonic() - started
    while status not in TERMINAL:
        status = client.get_job_status(job)
        time.sleep(0.2)
    if status != "SUCCEEDED" or not manifest.exists():
        raise SystemExit(f"{module} job {job} ended {status}:\n{client.get_job_logs(job)[-4000:]}")
    return seconds, json.loads(manifest.read_text())


def champion(client, work: Path, data: dict, params: dict, compute: dict, args) -> dict:
    """Tune with the DAG's defaults, train the best config; the test predictions and the wall times."""
    from airflow_ray_ml_stages.search_space import default_search_space
    from airflow_ray_ml_stages.train.run_dir import read_evaluation

    shared = {"feature_columns": data["feature_columns"], "label_column": data["label_column"],
              "preprocessor_uri": data["preprocessor_uri"], "preprocessor_variants": data["preprocessor_variants"],
              "data_fingerprint": data["fingerprint"], "compute": compute, "classes": data.get("classes")}
    splits = {f"{name}_uri": data["split_uris"][name] for name in ("train", "validation")}
    space = default_search_space(args.families or params["families"], params["scalers"], params["max_epochs"],
                                 params["num_boost_round"])
    tune_spec = {**shared, **splits, "artifact_dir": str(work / "tune"), "search_space": space,
                 "num_samples": args.num_trials, "time_budget_s": args.time_budget_s, "searcher": params["searcher"]}
    if args.ensemble_size is not None:
        tune_spec["ensemble_size"] = args.ensemble_size
    tune_s, tuned = submit(client, "airflow_ray_ml_stages.tune", tune_spec)
    print(f"tune: {tune_s:.1f} s, trials {tuned['trials']}, best {tuned['metric']}={tuned['best_metric']:.4f}: "
          f"{json.dumps(tuned['best_config'])}", flush=True)
    for row in json.loads(Path(tuned["leaderboard_json_uri"]).read_text()):
        value = (row["metrics"] or {}).get(tuned["metric"])
        print(f"  #{row['rank']:<2} {row['family']:9} {row['scaler'] or '-':8} {row['status']:13} "
              f"{tuned['metric']} {'-' if value is None else f'{value:.4f}':>8} {row['iterations']:>2} reports "
              f"{row['time_s']:5.1f} s", flush=True)
    train_spec = {**shared, **splits, "test_uri": data["split_uris"]["test"], "artifact_dir": str(work / "train"),
                  "config": tuned["best_config"]}
    train_s, trained = submit(client, "airflow_ray_ml_stages.train", train_spec)
    ran = {key: trained["training"][key] for key in ("rounds_run", "epochs_run", "trees", "members")
           if key in trained["training"]}
    print(f"train: {train_s:.1f} s, {trained['family']} {ran}; test {json.dumps(trained['metrics']['test'])}",
          flush=True)
    labels, predictions = read_evaluation(str(work / "train"), "test")
    return {"labels": labels, "predictions": predictions, "seconds": tune_s + train_s, "tune_s": tune_s,
            "train_s": train_s, "tuned": tuned, "trained": trained}


# -- the baselines -------------------------------------------------------------------------------


def baselines(data: dict, task: str) -> dict[str, dict]:
    """The plain peers, library defaults, fitted on train + validation: ExtraTrees, random forest,
    HistGradientBoosting, XGBoost and a linear model (ridge / logistic regression). The trees take the
    splits' missing values (NaN) as they are; the linear model gets them imputed as the project's
    models do (the preprocessor's fill vector)."""
    import xgboost
    from sklearn import ensemble, linear_model

    train_x, train_y = read_split(data, "train")
    validation_x, validation_y = read_split(data, "validation")
    test_x, _ = read_split(data, "test")
    x, y = np.concatenate([train_x, validation_x]), np.concatenate([train_y, validation_y])
    classify = task == "classification"
    kind = "Classifier" if classify else "Regressor"
    models = {
        "extra trees": getattr(ensemble, f"ExtraTrees{kind}")(n_estimators=500, n_jobs=CLUSTER_CPUS, random_state=0),
        "random forest": getattr(ensemble, f"RandomForest{kind}")(n_jobs=CLUSTER_CPUS, random_state=0),
        "hist gradient boosting": getattr(ensemble, f"HistGradientBoosting{kind}")(random_state=0),
        "xgboost": getattr(xgboost, f"XGB{kind}")(n_jobs=CLUSTER_CPUS),
        "linear": linear_model.LogisticRegression(max_iter=2000) if classify else linear_model.Ridge(),
    }
    fill = _fill(data)
    found = {}
    for name, model in models.items():
        started = time.monotonic()
        fit_x, predict_x = (_filled(x, fill), _filled(test_x, fill)) if name == "linear" else (x, test_x)
        if classify:
            model.fit(fit_x, y.astype(np.int64))
            predicted = _all_classes(model.predict_proba(predict_x), model.classes_, _class_count(data))
        else:
            model.fit(fit_x, y.astype(np.float64))
            predicted = model.predict(predict_x)
        found[name] = {"predictions": predicted, "seconds": time.monotonic() - started}
    return found


def _fill(data: dict) -> np.ndarray | None:
    from airflow_ray_ml_stages.preprocessor import feature_fill

    values = feature_fill(data["preprocessor_uri"], data["feature_columns"])
    return None if values is None else np.asarray(values)


def _filled(x: np.ndarray, fill: np.ndarray | None) -> np.ndarray:
    from airflow_ray_ml_stages.preprocessor import fill_missing

    return fill_missing(x, fill)


def flaml_peer(data: dict, task: str, seconds: float) -> dict:
    """FLAML's AutoML given ``seconds`` of wall time on the bench cluster's CPUs, on train + validation, with
    missing values imputed as the project's models get them (some of its learners refuse NaN)."""
    from flaml import AutoML

    train_x, train_y = read_split(data, "train")
    validation_x, validation_y = read_split(data, "validation")
    test_x, _ = read_split(data, "test")
    fill = _fill(data)
    x, y = _filled(np.concatenate([train_x, validation_x]), fill), np.concatenate([train_y, validation_y])
    test_x = _filled(test_x, fill)
    automl = AutoML()
    started = time.monotonic()
    classify = task == "classification"
    automl.fit(x, y.astype(np.int64) if classify else y.astype(np.float64), task=task,
               metric="log_loss" if classify else "rmse", time_budget=max(1.0, seconds), n_jobs=CLUSTER_CPUS,
               seed=0, verbose=0)
    if classify:
        predicted = _all_classes(automl.predict_proba(test_x), np.asarray(automl.classes_), _class_count(data))
    else:
        predicted = automl.predict(test_x)
    return {"predictions": predicted, "seconds": time.monotonic() - started, "best": automl.best_estimator}


def _class_count(data: dict) -> int | None:
    return len(data.get("classes") or []) or None


def _all_classes(probabilities: np.ndarray, seen: np.ndarray, classes: int | None) -> np.ndarray:
    """Probabilities over every class index, where the fitted model saw only some of them."""
    classes = classes or int(seen.max()) + 1
    full = np.zeros((len(probabilities), classes))
    full[:, seen.astype(np.int64)] = probabilities
    return full


def blend_bound(task: str, labels, predictions: dict[str, np.ndarray]) -> tuple[float, dict[str, float]]:
    """The best convex blend of ``predictions`` with its weights fitted on these labels: the task's metric, the weights.

    A bound, not a model: the weights are chosen on the test rows they are scored on, so no model
    built from the same predictions, its weights chosen on other rows, scores better than this.
    Given the peers, it says how far below the best peer a blend of them could reach at the very
    most, which is what an ensemble of tuned models of the same kinds has to beat by the goal's margin.
    """
    from scipy.optimize import minimize

    names = list(predictions)
    stacked = np.stack([np.asarray(predictions[name], np.float64) for name in names])
    metric = DEFAULT_METRIC[task]

    def score(weights: np.ndarray) -> float:
        return metrics_of(task, labels, np.tensordot(weights, stacked, axes=1))[metric]

    # from the best single model and from equal weights; SLSQP keeps the weights on the simplex
    singles = [score(np.eye(len(names))[index]) for index in range(len(names))]
    starts = [np.eye(len(names))[int(np.argmin(singles))], np.full(len(names), 1 / len(names))]
    best = min((minimize(score, start, method="SLSQP", bounds=[(0.0, 1.0)] * len(names),
                         constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}]) for start in starts),
               key=lambda found: found.fun)
    weights = np.clip(best.x, 0.0, None)
    weights /= weights.sum()
    if score(weights) > min(singles):  # the solver stopped short: the best single model is a blend too
        weights = starts[0]
    return score(weights), {name: float(weight) for name, weight in zip(names, weights)}


def metrics_of(task: str, labels, predictions) -> dict[str, float]:
    if task == "classification":
        from airflow_ray_ml_stages.metrics import classification_metrics

        return classification_metrics(labels, predictions)
    return regression_metrics(labels, predictions)


# -- the report ----------------------------------------------------------------------------------


def print_table(title: str, rows: dict[str, dict[str, float]], goal: dict[str, str], seconds: dict[str, float] | None,
                count: int) -> None:
    print(f"\n{title} ({count} test rows)\n")
    header = ["model", *goal, *(["seconds"] if seconds else [])]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, metrics in rows.items():
        cells = [name, *(f"{metrics[m]:.4f}" for m in goal), *([f"{seconds[name]:.1f}"] if seconds else [])]
        print("| " + " | ".join(cells) + " |")


def verdicts(rows: dict[str, dict[str, float]], goal: dict[str, str]) -> list[tuple[str, bool, str]]:
    """Per metric: is the champion at least as good as the best peer? (metric, met, the line)."""
    found = []
    for metric, mode in goal.items():
        others = {name: metrics[metric] for name, metrics in rows.items() if name != "champion"}
        best_name = (min if mode == "min" else max)(others, key=others.get)
        ours, best = rows["champion"][metric], others[best_name]
        # Equal counts as met; a float's last digits are not a difference.
        met = ours <= best + 1e-9 if mode == "min" else ours >= best - 1e-9
        found.append((metric, met, f"{metric}: champion {ours:.4f} vs best peer {best:.4f} ({best_name}), "
                                   f"{'lower' if mode == 'min' else 'higher'} is better: "
                                   f"{'at least as good' if met else 'WORSE'}"))
    return found


GOAL_MIN_TEST_ROWS = 300
"""The goal holds per table from this many test rows (fewer are too noisy to compare one by one); every table
counts in the geometric mean."""
GOAL_RATIO, GOAL_MEAN_RATIO = 1.00, 0.98


def run_table(client, work: Path, args, params: dict, compute: dict, name: str, source: list[str] | None,
              label: str, task: str, seed: int | None) -> dict:
    """One table on the split ``seed`` makes: the data stage, the plain peers, the champion (tune + train as
    Ray jobs), FLAML with the champion's seconds; prints its table and returns its summary row."""
    data = preprocess(work, args, label, source, task, seed)
    print(f"\n## {name}{'' if seed is None else f', split seed {seed}'}: rows {data['rows']}, {len(data['feature_columns'])} features, label {label!r} ({task}"
          f"{', classes ' + str(data['classes']) if data.get('classes') else ''}), "
          f"{data.get('rows_dropped', 0)} row(s) dropped", flush=True)
    found = baselines(data, task)
    ours = champion(client, work, data, params, compute, args)
    found["flaml"] = flaml_peer(data, task, ours["seconds"])
    print("peers: " + ", ".join(f"{peer} {run['seconds']:.1f} s" for peer, run in found.items())
          + f" (FLAML's best: {found['flaml']['best']})", flush=True)
    _, test_labels = read_split(data, "test")
    if not np.allclose(np.asarray(ours["labels"], np.float64), np.asarray(test_labels, np.float64)):
        raise SystemExit("the train stage's test rows are not the test split's rows in order")
    predictions = {"champion": ours["predictions"], **{peer: run["predictions"] for peer, run in found.items()}}
    seconds = {"champion": ours["seconds"], **{peer: run["seconds"] for peer, run in found.items()}}
    shown = goal = GOAL_METRICS[task]
    _, train_labels = read_split(data, "train")
    if task == "regression" and not graded(np.concatenate([train_labels, test_labels])):
        goal = {metric: mode for metric, mode in goal.items() if metric != "acc_0_5"}
    rows = {peer: metrics_of(task, test_labels, predicted) for peer, predicted in predictions.items()}
    tuned = ours["tuned"]
    print_table(f"{name}, label {label!r}, test split", rows, shown, seconds, len(test_labels))
    family = tuned["best_config"]["family"]
    members = tuned["best_config"].get("members")
    print(f"\nchampion: {family}" + (f" of {describe_members(members)}"
                                     if members else f" ({tuned['best_config'].get('scaler', 'as written')})")
          + f", {args.num_trials} trials ({tuned['trials']}), {params['searcher']} search; search "
          f"{ours['tune_s']:.1f} s + train {ours['train_s']:.1f} s (submit to manifest, Ray jobs on a local "
          f"{CLUSTER_CPUS}-CPU cluster). Peers: library defaults fitted on train + validation rows; FLAML given "
          f"the champion's {ours['seconds']:.0f} s on {CLUSTER_CPUS} CPUs.")
    for _, _, line in verdicts(rows, goal):
        print(line)
    if args.group_column:
        groups = test_groups(data, args.group_column)
        for group in sorted(set(groups)):
            mask = groups == group
            group_rows = {peer: metrics_of(task, test_labels[mask], np.asarray(predicted)[mask])
                          for peer, predicted in predictions.items()}
            print_table(f"{args.group_column} = {group}", group_rows, shown, None, int(mask.sum()))
            for _, _, line in verdicts(group_rows, goal):
                print(line)
    metric = DEFAULT_METRIC[task]
    others = {peer: found_rows[metric] for peer, found_rows in rows.items() if peer != "champion"}
    best = min(others, key=others.get)
    ratio = rows["champion"][metric] / others[best] if others[best] > 0 else float("inf")
    bound, weights = blend_bound(task, test_labels, {peer: run["predictions"] for peer, run in found.items()})
    bound_ratio = bound / others[best] if others[best] > 0 else 1.0
    print(f"the peers' best blend, weighted on the test rows themselves (a bound): {metric} {bound:.4f}, "
          f"{bound_ratio:.3f} x the best peer; weights "
          + ", ".join(f"{peer} {weight:.2f}" for peer, weight in weights.items() if weight >= 0.005))
    return {"table": name, "seed": seed, "task": task, "test_rows": len(test_labels), "metric": metric,
            "champion": rows["champion"][metric], "family": family, "best": best, "best_value": others[best],
            "flaml": rows["flaml"][metric], "ratio": ratio, "bound_ratio": bound_ratio,
            "tune_train_s": ours["seconds"]}


def print_summary(summary: list[dict]) -> bool:
    """The tables side by side with champion ÷ best peer, and the goal's verdict; whether it is met.

    With several split seeds, each table's verdict is on its median ratio over them, and the
    geometric mean is over the tables' medians: one run's ratio moves with the split's few hard rows
    and with FLAML, whose result given the same seconds varies by several per cent between runs.
    """
    print("\n## Summary\n")
    seeds = sorted({row["seed"] for row in summary}, key=lambda seed: (seed is None, seed))
    several = len(seeds) > 1
    print(f"| table (test rows){' | split seed' if several else ''} | metric | champion | best peer | "
          "FLAML, same seconds | champion ÷ best | peers' blend bound ÷ best |" + ("" if several else " verdict |"))
    print("|---" * 8 + "|")  # a split seed column, or a verdict column
    for row in summary:
        seed = f" | {row['seed']}" if several else ""
        print(f"| {row['table']} ({row['test_rows']}){seed} "
              f"| {row['metric']} | {row['champion']:.4f} ({row['family']}) | {row['best_value']:.4f} ({row['best']}) "
              f"| {row['flaml']:.4f} | {row['ratio']:.3f} | {row['bound_ratio']:.3f} |"
              + ("" if several else f" {verdict_of(row)[1]} |"))
    tables: dict[str, list[dict]] = {}
    for row in summary:
        tables.setdefault(row["table"], []).append(row)
    judged = [{**rows[0], "ratio": float(np.median([row["ratio"] for row in rows])),
               "bound_ratio": float(np.median([row["bound_ratio"] for row in rows])),
               "test_rows": min(row["test_rows"] for row in rows), "ratios": [row["ratio"] for row in rows]}
              for rows in tables.values()]
    if several:
        print(f"\n| table (fewest test rows) | champion ÷ best, split seeds {', '.join(map(str, seeds))} | median "
              "| peers' blend bound, median | verdict |")
        print("|---|---|---|---|---|")
        for row in judged:
            print(f"| {row['table']} ({row['test_rows']}) | {', '.join(f'{ratio:.3f}' for ratio in row['ratios'])} "
                  f"| {row['ratio']:.3f} | {row['bound_ratio']:.3f} | {verdict_of(row)[1]} |")
    def geometric_mean(rows: list[dict], key: str) -> float:
        return float(np.exp(np.mean([np.log(row[key]) for row in rows])))

    met = all(ok or not counted for counted, ok in (verdict_of(row)[0] for row in judged))
    mean = geometric_mean(judged, "ratio")
    met &= mean <= GOAL_MEAN_RATIO + 1e-9
    print(f"\ngeometric mean of champion ÷ best{' (each table its median)' if several else ''}: {mean:.3f} "
          f"(goal <= {GOAL_MEAN_RATIO}; each table with at least {GOAL_MIN_TEST_ROWS} test rows <= {GOAL_RATIO}): "
          f"{'met' if met else 'NOT met'}")
    large = [row for row in judged if verdict_of(row)[0][0]]
    print(f"the peers' blend bound (the best mix of their predictions, weighted on the test rows) ÷ best: "
          f"{geometric_mean(judged, 'bound_ratio'):.3f} in the same mean"
          + (f"; over the {len(large)} table(s) with at least {GOAL_MIN_TEST_ROWS} test rows, champion "
             f"{geometric_mean(large, 'ratio'):.3f} and bound {geometric_mean(large, 'bound_ratio'):.3f}"
             if large and len(large) < len(judged) else ""))
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}; machine: "
          f"{os.cpu_count()} CPUs, shared.")
    return met


def verdict_of(row: dict) -> tuple[tuple[bool, bool], str]:
    """((whether the table counts, whether its ratio meets the goal), the verdict's words)."""
    counted = row["test_rows"] >= GOAL_MIN_TEST_ROWS
    ok = row["ratio"] <= GOAL_RATIO + 1e-9
    return (counted, ok), ("met" if ok else "NOT met") if counted else f"(fewer than {GOAL_MIN_TEST_ROWS} test rows)"


def main() -> int:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", nargs="+", default=None, choices=["wine", *BUILT_IN_TABLES],
                        help="tables to run one after the other: wine (generated, as the demo DAG) and real tables "
                             "scikit-learn ships; default: wine, or --source")
    parser.add_argument("--source", nargs="+", help="your own CSV/Parquet files (one table)")
    parser.add_argument("--table", action="append", default=[], metavar="PATH:LABEL[:classification]",
                        help="one more table of your own, one file (repeat it for several tables)")
    parser.add_argument("--label", help="the label column of --source (default: the DAG's, quality)")
    parser.add_argument("--task", choices=["regression", "classification"], default="regression",
                        help="the task of --source")
    parser.add_argument("--label-threshold", type=float,
                        help="classification: two classes, 1 where the label is at least this (the DAG's "
                             "label_threshold); default: each label value is a class")
    parser.add_argument("--group-column", help="also print the metrics per value of this feature (wine: type)")
    parser.add_argument("--num-trials", type=int, help="default: the DAG's num_trials")
    parser.add_argument("--families", nargs="+", help="the families searched; default: the DAG's (every family): "
                                                      "with --ensemble-size 0, what each part of the search adds")
    parser.add_argument("--ensemble-size", type=int, help="the tune stage's ensemble_size (0: the best trial alone); "
                                                         "default: the stage's")
    parser.add_argument("--time-budget-s", type=float, help="default: the DAG's time_budget_s")
    parser.add_argument("--split-seed", type=int, nargs="+", default=[None],
                        help="the data stage's split seed; default: the DAG's (0). Several: each table runs once per "
                             "seed, and its verdict is on the median of its ratios")
    parser.add_argument("--rows", type=int, default=6497, help="generated wine rows (the DAG's demo_rows)")
    parser.add_argument("--demo-seed", type=int, default=7, help="generated wine seed (the DAG's demo_seed)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the goal is not met")
    args = parser.parse_args()

    from ray.job_submission import JobSubmissionClient

    from airflow_ray_ml_stages.probe import NodeResources, plan_cpu

    work = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    cluster = None
    summary = []
    try:
        params = dag_defaults(work)
        args.scalers = params["scalers"]
        args.num_trials = args.num_trials or params["num_trials"]
        args.time_budget_s = args.time_budget_s or params["time_budget_s"]
        cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bq", dir="/tmp"), num_cpus=CLUSTER_CPUS,
                                  num_gpus=0, token=new_token())
        cluster.start()
        client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
        # What the probe task plans for this cluster (one CPU worker; two trials at once).
        compute = plan_cpu([NodeResources("head", float(CLUSTER_CPUS), 0.0)], 1, "bench: the probe's CPU plan").to_dict()
        tables = args.tables or ([] if args.source or args.table else ["wine"])
        runs = [(name, None, params["label_column"], "regression") if name == "wine"
                else (name, *built_in_table(work, name)) for name in tables]
        if args.source:
            runs.append((", ".join(Path(path).name for path in args.source), args.source,
                         args.label or params["label_column"], args.task))
        for given in args.table:
            path, label, *task = given.split(":")
            runs.append((Path(path).name, [path], label, task[0] if task else "regression"))
        for index, (name, source, label, task) in enumerate(runs):
            for seed in args.split_seed:
                table_work = work / f"table-{index}-seed-{seed}"
                table_work.mkdir()
                summary.append(run_table(client, table_work, args, params, compute, name, source, label, task, seed))
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    met = print_summary(summary)
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
