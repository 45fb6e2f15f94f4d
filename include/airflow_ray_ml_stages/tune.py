"""Stage ``tune``: search model family x scaler x hyperparameters with Ray Tune, and rank every trial.

Run as ``python -m airflow_ray_ml_stages.tune --spec '<json>'`` (a Ray job). The stage

1. checks the data and the search space (:mod:`airflow_ray_ml_stages.search_space`), and works out, once, how each
   scaler in the space maps the written splits (an affine map per feature from the preprocess
   manifest's variants: trials never refit a preprocessor);
2. runs ``Tuner`` over a function trainable: each trial runs in its own actor with the compute
   spec's per-trial resources, trains with the train stage's own loops (``airflow_ray_ml_stages.train``) on the
   preprocessed training split, and reports its validation metrics ``reports_per_trial`` times
   over its budget with ``ray.tune.report``; ASHA (default) stops poor trials at those reports;
3. scores each completed trial's final model on the validation split exactly as the train stage
   does (so RayTrain given the best config reproduces it), records failed and early-stopped trials
   too, and writes the leaderboard (JSON and CSV), a plot, and the best trial's model directory.
   Where the validation split is too small to rank trials by (:mod:`airflow_ray_ml_stages.folds`),
   each trial instead trains one model per fold of the pooled training and validation rows, is
   scored on its out-of-fold predictions, and its model is their average;
4. selects an ensemble of the completed trials on their validation predictions
   (:mod:`airflow_ray_ml_stages.ensemble`): where it beats every trial it is the leaderboard's
   first row (``ensemble``) and the best config, its members the trials' models as trained.

The test split is not read: choosing never sees it.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import logging
import math
import os
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.capacity import (
    TRIALS_PER_GPU, Capacity, TrialPlan, describe, fixes, live_capacity, plan_trials, trial_threads, waiting_reason,
)
from airflow_ray_ml_stages.constants import JOB_ENV_VARS, TUNE_PROGRESS_MARKER, WAITING_NAME
from airflow_ray_ml_stages.device import choose_device
from airflow_ray_ml_stages.ensemble import (HOLDOUT_REPEATS, HOLDOUT_TOLERANCE, LIBRARY_FACTOR, assemble,
                                            describe_members, ensemble_card, holdout_ratio, library, select_ensemble)
from airflow_ray_ml_stages.errors import ResourcesUnavailableError, TuneError
from airflow_ray_ml_stages.folds import FOLDS_DIR, cross_validation_reason, write_folds
from airflow_ray_ml_stages.metrics import TASK_METRICS, task_metrics, validation_metrics
from airflow_ray_ml_stages.model_card import MODEL_CARD, ModelCard
from airflow_ray_ml_stages.models import PREPROCESSOR, member_dir
from airflow_ray_ml_stages.preprocessor import feature_fill, input_types_of
from airflow_ray_ml_stages.probe import cpu_headroom
from airflow_ray_ml_stages.search_space import SearchSpace
from airflow_ray_ml_stages.specs import ComputeSpec, TuneResult, TuneSpec
from airflow_ray_ml_stages.stage import main_of, run_stage
from airflow_ray_ml_stages.train.config import ENSEMBLE, resolve_train_config, training_length
from airflow_ray_ml_stages.train.run_dir import read_evaluation, read_final, write_split_evaluation

log = logging.getLogger("airflow_ray_ml_stages.tune")

TRIALS_DIR = "trials"
TUNE_RUNS_DIR = "tune_runs"
LEADERBOARD_JSON = "leaderboard.json"
LEADERBOARD_CSV = "leaderboard.csv"
PLOT = "leaderboard.png"
COMPLETED, EARLY_STOPPED, FAILED = "COMPLETED", "EARLY_STOPPED", "FAILED"


# -- a trial (runs in its own Ray Tune actor) --------------------------------------------------


def trial_dir(artifact_dir: str, trial_id: str) -> str:
    return artifacts.join(artifact_dir, TRIALS_DIR, trial_id)


def run_trial(sampled: dict[str, Any], base: dict[str, Any]) -> None:
    """Train one sampled config with the train stage's loop and report to Ray Tune.

    ``base`` holds what every trial shares (URIs, columns, label mean and std, the scalers' feature maps,
    seed, threads, the cross-validation folds); the trial writes into ``<artifact_dir>/trials/<trial_id>/``.
    With folds (:mod:`airflow_ray_ml_stages.folds`) it trains one model per fold under its model
    directory's ``members/<i>/``, writes their out-of-fold predictions as its validation
    predictions, and its model directory is their average (family ``ensemble``, equal weights).
    """
    from ray import tune

    from airflow_ray_ml_stages.train.contexts import FoldTrialContext
    from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig
    from airflow_ray_ml_stages.train.loops import TRAIN_LOOPS, tune_report

    space = SearchSpace(base["search_space"])
    config = space.decode(sampled)
    trial_id = tune.get_context().get_trial_id()
    directory = trial_dir(base["artifact_dir"], trial_id)
    artifacts.write_json_atomic(artifacts.join(directory, "config.json"), config)
    resolved = resolve_train_config(config)  # a bad combination fails this trial, not the search
    family = resolved["family"]
    scaling = base["scalers"].get(config.get("scaler") or "", {"affine": None, "preprocessor_uri": base["preprocessor_uri"]})
    budget = training_length(family, resolved)
    cfg = TrainLoopConfig(
        config=resolved, feature_columns=base["feature_columns"], label_column=base["label_column"],
        label_mean=base["label_mean"], label_std=base["label_std"], class_priors=base["class_priors"],
        seed=base["seed"], use_gpu=base["use_gpu"], local_mode=True,
        threads=base["threads"], checkpoint_every=max(1, math.ceil(budget / base["reports_per_trial"])),
        artifact_dir=directory, model_dir=artifacts.join(directory, "model"),
        feature_affine=scaling["affine"], uris=base["uris"], data_loading="direct", session="tune",
        feature_fill=None if family == "xgboost" else base["feature_fill"],  # XGBoost takes NaN as missing
    )
    trained = {"family": family, "scaler": config.get("scaler"),
               "config": {**resolved, **({"scaler": config["scaler"]} if config.get("scaler") else {})}}
    preprocessor_json = artifacts.read_bytes(scaling["preprocessor_uri"]) if scaling["preprocessor_uri"] else None

    def train(loop_config: TrainLoopConfig, context: Any = None) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """One model trained and its card written: its validation labels, predictions and metrics."""
        TRAIN_LOOPS[family](loop_config, context)
        labels, predictions = read_evaluation(loop_config.artifact_dir, "validation")
        metrics = task_metrics(cfg.task, labels, predictions)
        if preprocessor_json is not None:
            artifacts.write_bytes_atomic(artifacts.join(loop_config.model_dir, PREPROCESSOR), preprocessor_json)
        ModelCard(
            family=family, feature_columns=base["feature_columns"], label_column=base["label_column"],
            task=cfg.task, classes=base["classes"], config=trained["config"], metrics={"validation": metrics},
            seed=base["seed"], data_fingerprint=base["data_fingerprint"],
            preprocessor=PREPROCESSOR if preprocessor_json is not None else None, trial_id=trial_id,
            input_types=None if preprocessor_json is None else input_types_of(preprocessor_json),
            # the Lightning loop's: which Lightning package trained it
            framework_versions=read_final(loop_config.artifact_dir).get("framework_versions"),
        ).write(loop_config.model_dir)
        return labels, predictions, metrics

    if not base["folds"]:
        labels, predictions, _ = train(cfg)
    else:
        members, fold_labels, fold_predictions = [], [], []
        for fold, uris in enumerate(base["folds"]):
            # the first fold reports to Tune as a trial without folds does: ASHA compares trials on it
            loop_config = dataclasses.replace(cfg, uris=uris, artifact_dir=artifacts.join(directory, FOLDS_DIR, str(fold)),
                                              model_dir=artifacts.join(cfg.model_dir, member_dir(fold)))
            labels, predictions, metrics = train(loop_config, None if fold == 0 else FoldTrialContext())
            fold_labels.append(labels)
            fold_predictions.append(predictions)
            members.append({**trained, "dir": member_dir(fold), "weight": 1.0 / len(base["folds"]), "fold": fold,
                            "trial_id": trial_id, "validation": metrics})
        labels, predictions = np.concatenate(fold_labels), np.concatenate(fold_predictions)
        write_split_evaluation(directory, "validation", labels, predictions)
        if base["preprocessor_uri"]:
            artifacts.write_bytes_atomic(artifacts.join(cfg.model_dir, PREPROCESSOR),
                                         artifacts.read_bytes(base["preprocessor_uri"]))
        data = SimpleNamespace(task=cfg.task, **{key: base[key] for key in (
            "feature_columns", "label_column", "classes", "seed", "data_fingerprint", "preprocessor_uri")})
        ensemble_card(data, members, trial_id=trial_id,
                      metrics={"validation": task_metrics(cfg.task, labels, predictions)}).write(cfg.model_dir)
    # The final model's metrics last: the searcher learns what RayTrain would reproduce.
    tune_report({"final": True}, cfg.task, labels, predictions)


# -- the leaderboard ---------------------------------------------------------------------------


def _error_text(error: BaseException | None) -> str | None:
    """The root cause of a trial's error, in one line (Ray wraps it in its own exceptions)."""
    if error is None:
        return None
    cause = error
    for _ in range(5):
        inner = getattr(cause, "cause", None) or cause.__cause__
        if inner is None or inner is cause:
            break
        cause = inner
    text = str(cause).strip().splitlines()
    lines = [line.strip() for line in text if line.strip()]
    # A RayTaskError's text is a traceback whose last line is the original "Type: message".
    message = lines[-1] if lines else type(cause).__name__
    if type(cause).__name__ not in message:
        message = f"{type(cause).__name__}: {message}"
    return message[:500]


def sort_rows(rows: list[dict[str, Any]], metric: str, mode: str) -> list[dict[str, Any]]:
    """Best first: completed trials by the metric, then early-stopped ones by their last report, then failed."""
    def key(row: dict[str, Any]):
        value = (row["metrics"] or {}).get(metric)
        group = {COMPLETED: 0, EARLY_STOPPED: 1, FAILED: 3}[row["status"]]
        if value is None and group < 3:
            group = 2
        signed = 0.0 if value is None else (value if mode == "min" else -value)
        return group, signed, row["trial_id"]

    ranked = sorted(rows, key=key)
    for rank, row in enumerate(ranked, start=1):
        row["rank"] = rank
    return ranked


def leaderboard_csv(rows: list[dict[str, Any]], task: str = "regression") -> str:
    """The leaderboard flattened: one column per metric of the task and per hyperparameter (``config.<name>``)."""
    metric_names = [f"val_{name}" for name in TASK_METRICS[task]]
    names = sorted({name for row in rows for name in row["config"] if name not in ("family", "scaler")})
    header = ["rank", "trial_id", "status", "family", "scaler", *metric_names, "iterations", "time_s",
              "started_at", "ended_at",
              *(f"config.{name}" for name in names), "error"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        metrics = row["metrics"] or {}
        writer.writerow([row["rank"], row["trial_id"], row["status"], row["family"], row["scaler"] or "",
                         *("" if metrics.get(m) is None else repr(metrics[m]) for m in metric_names),
                         row["iterations"], row["time_s"],
                         *("" if row.get(key) is None else row[key] for key in ("started_at", "ended_at")),
                         *("" if name not in row["config"] else _cell(row["config"][name]) for name in names),
                         row["error"] or ""])
    return buffer.getvalue()


def _cell(value: Any) -> str:
    import json

    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def plot_title(counts: dict[str, int], searcher: str, scheduler: str) -> str:
    """The plot's title: the trial counts (``1 trial``, ``4 trials``), the searcher and the scheduler."""
    total = counts["total"]
    return (f"{total} trial{'' if total == 1 else 's'} ({counts['completed']} completed, "
            f"{counts['early_stopped']} stopped early, {counts['failed']} failed): {searcher} search, "
            f"scheduler {scheduler}")


def plot_legend(rows: list[dict[str, Any]], histories: dict[str, list[tuple[float, float]]]
                ) -> tuple[list[str], list[str]]:
    """The (families, end states) the plot's legend names: only those of the trials it draws."""
    drawn = [row for row in rows if histories.get(row["trial_id"])]
    families = sorted({str(row["family"]) for row in drawn})
    statuses = [status for status in (COMPLETED, EARLY_STOPPED, FAILED) if any(row["status"] == status for row in drawn)]
    return families, statuses


def plot_leaderboard(rows: list[dict[str, Any]], histories: dict[str, list[tuple[float, float]]],
                     metric: str, mode: str, title: str) -> bytes:
    """PNG: each trial's reported metric over time, its end marked by status, and the best-so-far line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"lightning": "tab:blue", "xgboost": "tab:orange", "extra_trees": "tab:green",
               "random_forest": "tab:olive", "linear": "tab:purple"}
    markers = {COMPLETED: "o", EARLY_STOPPED: "x", FAILED: "v"}
    figure, axes = plt.subplots(figsize=(9, 5), dpi=100)
    try:
        for row in rows:
            history = histories.get(row["trial_id"]) or []
            if not history:
                continue
            times, values = zip(*history)
            colour = colours.get(row["family"], "tab:gray")
            axes.plot(times, values, color=colour, alpha=0.35, linewidth=1)
            axes.plot(times[-1], values[-1], marker=markers[row["status"]], color=colour, linestyle="none")
        finished = sorted((row["end_s"], row["metrics"][metric]) for row in rows
                          if row["status"] == COMPLETED and row["end_s"] is not None)
        if finished:
            best, steps = None, []
            for when, value in finished:
                if best is None or (value < best if mode == "min" else value > best):
                    best = value
                steps.append((when, best))
            last = max(time for history in histories.values() for time, _ in history) if any(histories.values()) else 0
            steps.append((max(last, steps[-1][0]), steps[-1][1]))
            axes.step(*zip(*steps), where="post", color="black", linewidth=2, label="best so far (completed)")
        families, statuses = plot_legend(rows, histories)
        for family in families:
            axes.plot([], [], color=colours.get(family, "tab:gray"), label=family)
        for status in statuses:
            axes.plot([], [], marker=markers[status], color="gray", linestyle="none",
                      label=status.lower().replace("_", " "))
        axes.set_xlabel("seconds since the search started")
        axes.set_ylabel(f"{metric} (validation)")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(loc="best", fontsize=8)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()
    finally:
        plt.close(figure)


# -- the driver (the Ray job's process) --------------------------------------------------------


def run_name(artifact_dir: str) -> str:
    """A fresh Tune run name per attempt: a retried task searches again rather than mixing runs."""
    return f"tune-{hashlib.sha1(artifact_dir.encode('utf-8')).hexdigest()[:12]}-{uuid.uuid4().hex[:6]}"


def _storage_path(artifact_dir: str) -> str:
    return artifacts.ray_storage_path(artifacts.join(artifact_dir, TUNE_RUNS_DIR))


def _searcher(spec: TuneSpec, max_concurrent: int):
    """The search algorithm, holding to ``max_concurrent`` trials at once. Ray Tune applies
    ``TuneConfig.max_concurrent_trials`` to a ``Searcher`` (Optuna's) only, and ignores it, with a
    warning, for the random search's generator, which takes its own limit."""
    from ray.tune.search import ConcurrencyLimiter

    if spec.searcher == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        # TPE; metric and mode come from TuneConfig
        return ConcurrencyLimiter(OptunaSearch(seed=spec.seed), max_concurrent=max_concurrent)
    space = spec.space()
    if spec.searcher == "adaptive" and not space.has_grid:  # a grid is every one of its points
        from airflow_ray_ml_stages.family_search import AdaptiveFamilySearch

        return ConcurrencyLimiter(AdaptiveFamilySearch(space.families, spec.start_points(), spec.seed),
                                  max_concurrent=max_concurrent)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=spec.seed, points_to_evaluate=spec.start_points() or None,
                                 max_concurrent=max_concurrent)


def _scheduler(spec: TuneSpec):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if spec.scheduler == "none":
        return FIFOScheduler()
    # Rungs count reports; a trial makes at most reports_per_trial + 1 (the final model's), so
    # ASHA never cuts a trial for reaching max_t: it ends by itself and writes its model.
    return ASHAScheduler(time_attr="training_iteration", max_t=spec.reports_per_trial + 1,
                         grace_period=spec.asha_grace_period, reduction_factor=spec.asha_reduction_factor)


def _plan(spec: TuneSpec, space: SearchSpace, compute: ComputeSpec, capacity: Capacity, train_rows: int
          ) -> tuple[TrialPlan, str | None]:
    """Each trial's resources and how many run at once; CPU when the cluster has no GPU to give (and why)."""
    threads = trial_threads(train_rows, len(spec.feature_columns), compute.cpus_per_worker)
    choices = [choose_device(compute, family=family, rows=train_rows, features=len(spec.feature_columns),
                             iterations=space.max_budget(family), accelerator=spec.accelerator)
               for family in space.families]
    gpus, fallback = 0.0, None
    if any(choice.use_gpu for choice in choices):
        # the search's models are small: several trials share one GPU
        gpus = float(compute.gpus_per_worker) / TRIALS_PER_GPU
        if capacity.total_gpus < gpus:
            gpus, fallback = 0.0, (
                f"the compute spec asks for a GPU but the cluster has {capacity.total_gpus:g}; tuning on CPU instead"
            )
    plan = plan_trials(capacity, threads=threads, gpus=gpus, headroom=cpu_headroom(capacity.total_cpus),
                       cpus_per_trial=spec.cpus_per_trial, max_concurrent=spec.max_concurrent_trials)
    return plan, fallback


class TrialClock:
    """When each trial started and ended (wall time), and whether the search may still wait for its first.

    Both a Tune callback (trial starts and ends) and a stopper: the search ends once
    ``resource_wait_s`` has passed with no trial started and none of its trials' resources granted
    (a granted trial is starting, not waiting). While trials wait, the reason is in the task log
    and in ``waiting.json`` beside the manifest (the Ray ML page shows it).
    """

    PROGRESS_EVERY_S = 30.0  # how often a running search says how far it is (progress_line)
    FIRST_LOOK_S = 10.0  # a trial starts within seconds on a free cluster: look for a reason after this
    LOOK_EVERY_S = 10.0
    LOOK_PAST_WAIT_S = 1.0  # past resource_wait_s, a look at once and then each second (a granted trial is starting)

    def __init__(self, spec: TuneSpec, plan: TrialPlan) -> None:
        from ray.tune import Callback, Stopper

        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.began = time.monotonic()
        self.gave_up = False
        self.reason = ""
        self._spec, self._plan, self._looked, self._pending = spec, plan, 0.0, False
        self._said = time.monotonic()
        clock = self

        class _Callback(Callback):
            def on_step_end(self, iteration, trials, **info):
                if time.monotonic() - clock._said >= clock.PROGRESS_EVERY_S:
                    clock._said = time.monotonic()
                    log.info("%s", progress_line(trials, spec.num_samples, spec.metric, spec.mode))

            def on_trial_start(self, iteration, trials, trial, **info):
                clock.started.setdefault(trial.trial_id, time.time())
                clock._write_waiting("running")

            def on_trial_complete(self, iteration, trials, trial, **info):
                clock.ended.setdefault(trial.trial_id, time.time())

            def on_trial_error(self, iteration, trials, trial, **info):
                clock.ended.setdefault(trial.trial_id, time.time())

        class _Stopper(Stopper):
            def __call__(self, trial_id, result):
                return False

            def stop_all(self):
                return clock.should_give_up()

        self.callback, self.stopper = _Callback(), _Stopper()

    def should_give_up(self) -> bool:
        if self.started or self.gave_up:
            return self.gave_up
        now = time.monotonic()
        waited, since_look = now - self.began, now - self._looked
        past_wait = waited > self._spec.resource_wait_s
        if past_wait and since_look < self.LOOK_PAST_WAIT_S:
            return False
        if not past_wait and (waited < self.FIRST_LOOK_S or since_look < self.LOOK_EVERY_S):
            return False
        self._looked = now
        capacity = live_capacity()
        if capacity.own_cpus or capacity.own_gpus:
            return False
        self.reason = waiting_reason(capacity, what="trial", cpus=self._plan.cpus, gpus=self._plan.gpus)
        log.warning("no trial has started after %.0f s: %s", waited, self.reason)
        self._write_waiting("pending")
        self.gave_up = past_wait
        return past_wait

    def _write_waiting(self, state: str) -> None:
        if state == "running" and not self._pending:
            return
        self._pending = state == "pending"
        artifacts.write_json_atomic(artifacts.join(self._spec.artifact_dir, WAITING_NAME),
                                    {"state": state, "what": "trials", "reason": self.reason if self._pending else "",
                                     "since": time.time()})

    def most_at_once(self) -> int:
        """The largest number of trials that ran at the same time."""
        return most_at_once([(start, self.ended.get(trial_id)) for trial_id, start in self.started.items()])


def progress_line(trials: list, total: int, metric: str, mode: str) -> str:
    """How far a search is, from Tune's trials (``status``, ``last_result``): one line beginning with
    ``TUNE_PROGRESS_MARKER``, e.g. ``tune progress: 5 of 12 trials ended (1 failed), 2 running, 5 to
    come; best val_rmse so far 0.7123 (trial 3b0f_00002)``."""
    ended = [trial for trial in trials if trial.status in ("TERMINATED", "ERROR")]
    failed = sum(trial.status == "ERROR" for trial in trials)
    running = sum(trial.status == "RUNNING" for trial in trials)
    scored = [(trial.last_result.get(metric), trial.trial_id) for trial in trials
              if isinstance((trial.last_result or {}).get(metric), (int, float))]
    line = (f"{TUNE_PROGRESS_MARKER}{len(ended)} of {total} trials ended" + (f" ({failed} failed)" if failed else "")
            + f", {running} running, {max(total - len(ended) - running, 0)} to come")
    if scored:
        value, trial_id = (min if mode == "min" else max)(scored)
        line += f"; best {metric} so far {value:.4g} (trial {trial_id})"
    return line


def most_at_once(spans: list[tuple[float, float | None]]) -> int:
    """The largest number of ``(start, end)`` spans that overlap (an end of None: still running)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans if end is not None],
                    key=lambda event: (event[0], event[1]))  # an end before a start at the same instant
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def run_tuning(spec: TuneSpec) -> TuneResult:
    """Run the search on the connected Ray cluster and write the leaderboard, plot and best model."""
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from airflow_ray_ml_stages.train.splits import ParquetSplit, label_stats, scaler_plan

    started_wall, started = time.time(), time.monotonic()
    space = spec.space()
    columns = [*spec.feature_columns, spec.label_column]
    train_rows, label_mean, label_std, class_priors = label_stats(spec.train_uri, spec.label_column, columns,
                                                                  spec.classes)
    validation_labels = ParquetSplit(spec.validation_uri, columns).to_table([spec.label_column]).column(
        spec.label_column).to_numpy(zero_copy_only=False)
    scalers = {}
    for scaler in space.scalers:
        if scaler is not None:
            affine, uri = scaler_plan(spec.preprocessor_uri, spec.preprocessor_variants, scaler, spec.feature_columns)
            scalers[scaler] = {"affine": affine, "preprocessor_uri": uri}
    compute = ComputeSpec.from_dict(spec.compute)

    missing_env = {key: value for key, value in JOB_ENV_VARS.items() if key not in os.environ}
    ray.init(address="auto", logging_level=logging.WARNING,
             runtime_env={"env_vars": missing_env} if missing_env else None)
    capacity = live_capacity()
    plan, fallback = _plan(spec, space, compute, capacity, train_rows)
    resources = {"cpu": plan.cpus, "gpu": plan.gpus}
    if fallback:
        log.warning("GPU fallback: %s", fallback)
    log.info("trial sizing: %s", plan.reason)
    if capacity.holders:
        log.info("the cluster now: %s", describe(capacity))
    base = {
        "search_space": space.raw, "artifact_dir": spec.artifact_dir, "feature_columns": list(spec.feature_columns),
        "label_column": spec.label_column, "label_mean": label_mean, "label_std": label_std,
        "class_priors": class_priors,
        "classes": spec.classes, "seed": spec.seed,
        "use_gpu": resources["gpu"] > 0, "threads": plan.threads,
        "reports_per_trial": spec.reports_per_trial, "scalers": scalers, "preprocessor_uri": spec.preprocessor_uri,
        "uris": {"train": spec.train_uri, "validation": spec.validation_uri},
        "data_fingerprint": spec.data_fingerprint,
        "feature_fill": feature_fill(spec.preprocessor_uri, list(spec.feature_columns)),
    }
    pooled_rows = train_rows + len(validation_labels)
    reason = cross_validation_reason(validation_labels, spec.classes, pooled_rows, spec.cv_folds, spec.cv_max_rows)
    base["folds"] = []
    if reason:
        base["folds"] = write_folds(spec.train_uri, spec.validation_uri, columns, spec.label_column, spec.cv_folds,
                                    spec.seed, spec.classes is not None, spec.artifact_dir)
        log.info("cross-validation: %s, so the %d training and validation rows are dealt into %d folds; each trial "
                 "trains a model per fold, is ranked by its out-of-fold predictions, and its model is their "
                 "average", reason, pooled_rows, spec.cv_folds)
    name = run_name(spec.artifact_dir)
    log.info("tuning: %d sample(s), searcher %s, scheduler %s, %s per trial, at most %s at once, %d training rows; "
             "run %s", spec.num_samples, spec.searcher, spec.scheduler, resources,
             plan.max_concurrent, train_rows, name)
    clock = TrialClock(spec, plan)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_trial, base=base), resources),
        param_space=space.to_ray(spec.start_points()),
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, num_samples=spec.num_samples,
            search_alg=_searcher(spec, plan.max_concurrent),
            scheduler=_scheduler(spec), time_budget_s=spec.time_budget_s, reuse_actors=spec.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=_storage_path(spec.artifact_dir), verbose=1,
            failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            # a trial's history (the plot) is read back from these two loggers' files
            callbacks=[clock.callback, CSVLoggerCallback(), JsonLoggerCallback()], stop=clock.stopper,
        ),
    )
    results = tuner.fit()
    if clock.gave_up:
        raise ResourcesUnavailableError(
            f"no trial could start within resource_wait_s={spec.resource_wait_s:g} s: {clock.reason}. Fix: "
            f"{fixes('cpus_per_trial')}"
        )
    rows, histories = collect_rows(results, space, spec, started_wall, clock)
    counts = {"total": len(rows), "completed": sum(r["status"] == COMPLETED for r in rows),
              "failed": sum(r["status"] == FAILED for r in rows),
              "early_stopped": sum(r["status"] == EARLY_STOPPED for r in rows)}
    ensemble = ensemble_row(spec, rows)
    rows = sort_rows([*rows, *([ensemble] if ensemble else [])], spec.metric, spec.mode)

    json_uri = artifacts.join(spec.artifact_dir, LEADERBOARD_JSON)
    csv_uri = artifacts.join(spec.artifact_dir, LEADERBOARD_CSV)
    plot_uri = artifacts.join(spec.artifact_dir, PLOT)
    public = [{key: value for key, value in row.items() if key != "end_s"} for row in rows]
    artifacts.write_json_atomic(json_uri, public)
    artifacts.write_bytes_atomic(csv_uri, leaderboard_csv(rows, spec.task).encode("utf-8"))
    title = plot_title(counts, spec.searcher, spec.scheduler)
    artifacts.write_bytes_atomic(plot_uri, plot_leaderboard(rows, histories, spec.metric, spec.mode, title))
    log.info("leaderboard: %s", json_uri)
    for row in rows[:10]:
        log.info("  #%d %s %s/%s %s %s=%s (%s iterations, %.1f s)%s", row["rank"], row["trial_id"], row["family"],
                 row["scaler"], row["status"], spec.metric, (row["metrics"] or {}).get(spec.metric),
                 row["iterations"], row["time_s"], f" error: {row['error']}" if row["error"] else "")

    if not counts["completed"]:
        first_error = next((row for row in rows if row["error"]), None)
        reason = (f"first error (trial {first_error['trial_id']}, {first_error['family']}): {first_error['error']}"
                  if first_error else "every trial was stopped before it finished (time_budget_s or the scheduler)")
        raise TuneError(
            f"no trial completed: {counts['total']} trial(s), {counts['failed']} failed, "
            f"{counts['early_stopped']} stopped early; {reason}. Fix the search space or the data (every trial is "
            f"listed in {json_uri}), or raise time_budget_s"
        )
    best = rows[0]
    best_config = best["config"]
    if best is ensemble:
        best_dir = write_ensemble_dir(spec, ensemble)
        log.info("the ensemble beats every trial on validation %s: %s", spec.metric,
                 describe_members(best["config"]["members"]))
    else:
        best_dir = artifacts.join(trial_dir(spec.artifact_dir, best["trial_id"]), "model")
        if base["folds"]:  # the trial's fold models, averaged: the train stage assembles them as they are
            best_config = {"family": ENSEMBLE, "members": trial_members(spec, best)}
    return TuneResult(
        best_config=best_config, best_trial_id=best["trial_id"], metric=spec.metric, mode=spec.mode,
        best_metric=best["metrics"][spec.metric], best_metrics=best["metrics"],
        best_checkpoint_uri=best_dir,
        leaderboard_json_uri=json_uri, leaderboard_csv_uri=csv_uri, plot_uri=plot_uri, trials=counts,
        searcher=spec.searcher, scheduler=spec.scheduler, time_s=round(time.monotonic() - started, 3),
        search_space=space.raw,
        resources_per_trial={**resources, "threads": plan.threads,
                             **({"gpu_fallback_reason": fallback} if fallback else {})},
        data_fingerprint=spec.data_fingerprint, trial_sizing=plan.reason, most_trials_at_once=clock.most_at_once(),
    )


def ensemble_row(spec: TuneSpec, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The leaderboard row of the ensemble of completed trials, where it beats the best of them on validation.

    Greedy selection (:func:`airflow_ray_ml_stages.ensemble.select_ensemble`) over the validation predictions
    of the completed trials within :data:`~airflow_ray_ml_stages.ensemble.LIBRARY_FACTOR` of the best
    (:func:`~airflow_ray_ml_stages.ensemble.library`), best trial first; None where it keeps one trial,
    fewer than two completed, or where its gain does not hold on validation rows it was not chosen on
    (:func:`airflow_ray_ml_stages.ensemble.holdout_ratio`).
    """
    completed = sort_rows([row for row in rows if row["status"] == COMPLETED], spec.metric, spec.mode)
    if len(completed) < 2 or not spec.ensemble_size:
        return None
    chosen_from = set(library({row["trial_id"]: row["metrics"][spec.metric] for row in completed}, spec.mode))
    completed = [row for row in completed if row["trial_id"] in chosen_from]
    if len(completed) < 2:
        log.info("ensemble selection kept the best trial alone: no other trial's %s is within %.1f times its loss",
                 spec.metric, LIBRARY_FACTOR)
        return None
    started = time.time()
    metric = spec.metric.removeprefix("val_")
    labels, predictions = None, {}
    for row in completed:
        labels, predictions[row["trial_id"]] = read_evaluation(trial_dir(spec.artifact_dir, row["trial_id"]), "validation")
    selection = select_ensemble(labels, predictions, spec.task, metric, spec.mode,
                                spec.ensemble_size)
    if len(selection.weights) < 2:
        log.info("ensemble selection kept the best trial alone: no average of trials beats it on %s", spec.metric)
        return None
    ratio = holdout_ratio(labels, predictions, spec.task, metric, spec.mode,
                          spec.ensemble_size, seed=spec.seed)
    if ratio is not None and ratio > HOLDOUT_TOLERANCE:
        log.info("ensemble selection kept the best trial alone: chosen on half of the validation rows, the "
                 "ensemble's %s on the other half is %.3f times the best trial's (median of %d halvings; it "
                 "is kept up to %.2f)", spec.metric, ratio, 2 * HOLDOUT_REPEATS, HOLDOUT_TOLERANCE)
        return None
    if ratio is not None:
        log.info("ensemble of %d trials: on held-out halves of the validation rows its %s is %.3f times the best "
                 "trial's", len(selection.weights), spec.metric, ratio)
    by_id = {row["trial_id"]: row for row in completed}
    members = [member for trial_id, weight in selection.weights
               for member in trial_members(spec, by_id[trial_id], weight)]
    ended = time.time()
    return {"rank": 0, "trial_id": ENSEMBLE, "family": ENSEMBLE, "scaler": None,
            "config": {"family": ENSEMBLE, "members": members},
            "metrics": {f"val_{name}": value for name, value in selection.metrics.items()}, "status": COMPLETED,
            "iterations": selection.rounds, "time_s": round(ended - started, 3), "error": None, "end_s": None,
            "started_at": round(started, 3), "ended_at": round(ended, 3)}


def trial_members(spec: TuneSpec, row: dict[str, Any], weight: float = 1.0) -> list[dict[str, Any]]:
    """A completed trial as ensemble members (``weight`` shared among them): its model directory, or each of
    its fold models where it was cross-validated (its directory is their average)."""
    model_dir = artifacts.join(trial_dir(spec.artifact_dir, row["trial_id"]), "model")
    recorded = {"trial_id": row["trial_id"], "family": row["family"], "scaler": row["scaler"], "config": row["config"],
                "validation": {name.removeprefix("val_"): value for name, value in row["metrics"].items()}}
    card = ModelCard.read(model_dir)
    if card.family != ENSEMBLE:
        return [{"model_dir": model_dir, "weight": weight, **recorded}]
    return [{"model_dir": artifacts.join(model_dir, fold["dir"]), "weight": weight * fold["weight"], **recorded,
             "fold": fold["fold"]} for fold in card.config["members"]]


def write_ensemble_dir(spec: TuneSpec, row: dict[str, Any]) -> str:
    """The ensemble's model directory under the search's (its members copied, a validation-only card)."""
    model_dir = artifacts.join(spec.artifact_dir, ENSEMBLE, "model")
    listed = assemble(row["config"]["members"], model_dir, spec.preprocessor_uri)
    ensemble_card(spec, listed, trial_id=ENSEMBLE,
                  metrics={"validation": {name.removeprefix("val_"): value for name, value in row["metrics"].items()}}
                  ).write(model_dir)
    return model_dir


def collect_rows(results, space: SearchSpace, spec: TuneSpec, started_wall: float,
                 trial_clock: TrialClock | None = None):
    """One leaderboard row per trial from Tune's results and the trial's own directory.

    ``started_at`` and ``ended_at`` (Unix seconds) come from ``trial_clock``, the end else from the
    trial's last report.
    """
    rows, histories = [], {}
    for result in results:
        last = result.metrics or {}
        trial_id = last.get("trial_id") or os.path.basename(str(result.path or "")).split("_")[-1]
        try:
            sampled = space.decode(result.config)
            config = {**resolve_train_config(sampled), **({"scaler": sampled["scaler"]} if "scaler" in sampled else {})}
        except Exception:  # a config training rejects: show it as sampled (the trial failed on it)
            try:
                config = space.decode(result.config)
            except (KeyError, IndexError, ValueError, TypeError):
                config = dict(result.config or {})
        directory = trial_dir(spec.artifact_dir, trial_id)
        error = _error_text(result.error)
        reported = last.get("training_iteration") is not None
        if error:
            status = FAILED
        elif artifacts.exists(artifacts.join(directory, "model", MODEL_CARD)):
            status = COMPLETED
        else:
            status = EARLY_STOPPED
            if not reported:
                error = "stopped before its first report (time_budget_s reached)"
        metrics = None
        names = [f"val_{name}" for name in TASK_METRICS[spec.task]]
        if status == COMPLETED:
            labels, predictions = read_evaluation(directory, "validation")
            metrics = validation_metrics(spec.task, labels, predictions)
        elif reported and all(name in last for name in names):
            metrics = {name: float(last[name]) for name in names}
        frame = result.metrics_dataframe
        history: list[tuple[float, float]] = []
        clock = "reported_at" if frame is not None and "reported_at" in frame else "timestamp"
        if frame is not None and len(frame) and spec.metric in frame and clock in frame:
            history = [(float(t) - started_wall, float(v)) for t, v in zip(frame[clock], frame[spec.metric])
                       if v == v and t == t]
        histories[trial_id] = history
        rows.append({
            "rank": 0, "trial_id": trial_id, "family": config.get("family"), "scaler": config.get("scaler"),
            "config": config, "metrics": metrics, "status": status,
            "iterations": int(last.get("training_iteration") or 0),
            "time_s": round(float(last.get("time_total_s") or 0.0), 3), "error": error,
            "end_s": history[-1][0] if history else None,
            **_span(trial_clock, trial_id, history, started_wall),
        })
    return rows, histories


def _span(clock: TrialClock | None, trial_id: str, history: list[tuple[float, float]], started_wall: float
          ) -> dict[str, float | None]:
    started = clock.started.get(trial_id) if clock else None
    ended = clock.ended.get(trial_id) if clock else None
    if ended is None and history:
        ended = started_wall + history[-1][0]
    return {"started_at": None if started is None else round(started, 3),
            "ended_at": None if ended is None else round(ended, 3)}


def main(argv: list[str] | None = None) -> int:
    return run_stage(TuneSpec, run_tuning, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
