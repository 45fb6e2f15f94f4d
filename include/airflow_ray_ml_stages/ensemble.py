"""Ensembles of trained trials: chosen on the validation split, assembled into one model directory.

After a search, :func:`select_ensemble` runs greedy ensemble selection with replacement (Caruana
et al., 2004, as AutoGluon's weighted ensemble does): starting from nothing, it adds, round after
round, the completed trial whose predictions improve the average most on the validation split,
and keeps the best prefix of those rounds. The weight of a trial is the share of the rounds that
picked it. Regression averages the predicted values, classification the class probabilities.

The trials' models are kept as they are, never refitted: :func:`assemble` copies each member's
model directory (model, preprocessor, card) under ``members/<i>/`` of the ensemble's directory,
whose card (family ``ensemble``) lists the members, their weights and their validation metrics.
:class:`airflow_ray_ml_stages.models.EnsembleModel` loads it as one model: each member is given
the features as its own preprocessor scales them (an exact affine map of the ensemble's), so the
endpoint, batch scoring, the gate and rollback treat it as any other model directory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.metrics import task_metrics
from airflow_ray_ml_stages.models import PREPROCESSOR, member_dir

SELECTION_ROUNDS = 25
"""Rounds of selection by default (TuneSpec's ``ensemble_size``): AutoGluon's default is 25 too."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """The trials an ensemble averages, with their weights (shares summing to 1), and its metrics.

    :param weights: ``(trial_id, weight)`` in the order the selection first picked them.
    :param metrics: the ensemble's validation metrics (the task's, without the ``val_`` prefix).
    :param rounds: the selection rounds kept (the best prefix).
    """

    weights: list[tuple[str, float]]
    metrics: dict[str, float]
    rounds: int


def select_ensemble(labels: np.ndarray, predictions: dict[str, np.ndarray], task: str, metric: str, mode: str,
                    rounds: int = SELECTION_ROUNDS) -> Selection:
    """Greedy selection with replacement over ``predictions`` (trial id -> validation predictions).

    :param metric: the metric chosen by (``rmse``, ``log_loss``, ... without the ``val_`` prefix).
    :param mode: ``min`` or ``max``: its direction.
    A tie goes to the trial listed first (list them best first). The first round picks the best
    single trial, so the result is never worse than it on ``metric``; it holds one trial where no
    average beats that trial.
    """
    if not predictions or rounds < 1:
        raise ValueError("select_ensemble needs at least one trial's predictions and one round")
    names = list(predictions)
    stacked = np.stack([np.asarray(predictions[name], dtype=np.float64) for name in names])
    sign = 1.0 if mode == "min" else -1.0
    total = np.zeros_like(stacked[0])
    counts = np.zeros(len(names), dtype=np.int64)
    best_score, best_counts, best_round, order = np.inf, counts.copy(), 0, []
    for round_number in range(1, rounds + 1):
        scores = [sign * task_metrics(task, labels, (total + candidate) / round_number)[metric] for candidate in stacked]
        chosen = int(np.argmin(scores))  # the first of equal scores
        total += stacked[chosen]
        counts[chosen] += 1
        if names[chosen] not in order:
            order.append(names[chosen])
        if scores[chosen] < best_score - 1e-12:
            best_score, best_counts, best_round = scores[chosen], counts.copy(), round_number
    averaged = sum(best_counts[index] * stacked[index] for index in range(len(names))) / best_round
    weights = [(name, float(best_counts[names.index(name)] / best_round)) for name in order
               if best_counts[names.index(name)]]
    return Selection(weights, task_metrics(task, labels, averaged), best_round)


LIBRARY_FACTOR = 1.5
"""Ensemble selection chooses among the trials whose validation loss is at most this many times the best
trial's (:func:`library`)."""


def library(scores: dict[str, float], mode: str, factor: float = LIBRARY_FACTOR) -> list[str]:
    """The trials selection may choose, best first: those within ``factor`` of the best trial's loss.

    Pruning the library to its better models makes ensemble selection overfit less (Caruana et al.,
    2006). A trial far behind the best adds to the average mostly what fits the validation rows:
    a forest's probabilities of 0 and 1 for a rare class lower the validation log loss of an average
    that does worse on new rows. The loss is the metric itself (``min``), or its shortfall from 1
    for a share to maximise (accuracy, F1, within 0.5).
    """
    losses = {name: value if mode == "min" else 1.0 - value for name, value in scores.items()}
    best = min(losses.values())
    return [name for name in sorted(losses, key=losses.get) if losses[name] <= factor * best + 1e-12]


HOLDOUT_REPEATS = 3
"""Random halvings of the validation rows :func:`holdout_ratio` selects on and scores on (each both ways)."""
HOLDOUT_TOLERANCE = 1.01
"""The ensemble is kept unless, on the halves it was not chosen on, it does more than 1 % worse than
the best single trial (:func:`holdout_ratio`): each half's selection saw half the rows the final one
sees, so the check understates what an ensemble gains, and a tie goes to the ensemble."""
HOLDOUT_MIN_ROWS = 20
"""Fewer validation rows than this are not halved: the selection is kept as it is."""


def holdout_ratio(labels: np.ndarray, predictions: dict[str, np.ndarray], task: str, metric: str, mode: str,
                  rounds: int = SELECTION_ROUNDS, repeats: int = HOLDOUT_REPEATS, seed: int = 0) -> float | None:
    """Does the selection's gain hold on rows it did not see? The median, over ``repeats`` random halvings of
    the validation rows and both ways round, of the ensemble selected on one half against the best
    single trial on that half, both scored on the other: their ratio as a loss (above 1: the ensemble
    does worse). Greedy selection fits its weights to the rows it chooses on; where its gain is noise
    (a class that is rare, probabilities a forest gives as 0 or 1), the best trial alone does better
    on new rows. None where there are fewer than :data:`HOLDOUT_MIN_ROWS` rows."""
    count = len(labels)
    if count < HOLDOUT_MIN_ROWS:
        return None
    generator = np.random.default_rng(seed)

    def value(rows: np.ndarray, predicted: np.ndarray) -> float:
        return task_metrics(task, labels[rows], predicted)[metric]

    sign = 1.0 if mode == "min" else -1.0
    ratios = []
    for _ in range(repeats):
        order = generator.permutation(count)
        halves = (order[: count // 2], order[count // 2:])
        for chosen_on, scored_on in (halves, halves[::-1]):
            selection = select_ensemble(labels[chosen_on], {name: values[chosen_on] for name, values in predictions.items()},
                                        task, metric, mode, rounds)
            average = sum(weight * np.asarray(predictions[name], np.float64)[scored_on]
                          for name, weight in selection.weights)
            single = min(predictions, key=lambda name: sign * value(chosen_on, predictions[name][chosen_on]))
            ours, theirs = value(scored_on, average), value(scored_on, predictions[single][scored_on])
            # a ratio of losses: for a metric to maximise, the single trial's value over the ensemble's
            worse, better = (ours, theirs) if mode == "min" else (theirs, ours)
            ratios.append(worse / better if better else (1.0 if worse == better else np.inf))
    return float(np.median(ratios))


def describe_members(members: list[dict[str, Any]]) -> str:
    """An ensemble config's members in one line, each trial once (its fold models' weights summed):
    ``1a2b3c4d (xgboost, 5 folds) x 0.75, 5e6f7a8b (linear) x 0.25``."""
    trials: dict[str, list] = {}
    for index, member in enumerate(members):
        entry = trials.setdefault(member.get("trial_id") or f"member {index}", [member.get("family"), 0.0, 0])
        entry[1] += member["weight"]
        entry[2] += 1
    return ", ".join(f"{trial} ({family}{f', {count} folds' if count > 1 else ''}) x {weight:.2f}"
                     for trial, (family, weight, count) in trials.items())


def ensemble_card(data: Any, members: list[dict[str, Any]], **fields: Any):
    """The card of an ensemble directory for ``data`` (a TuneSpec or TrainSpec: its columns, task,
    classes, seed, fingerprint and preprocessor) and its listed ``members``; ``fields``: the rest."""
    from airflow_ray_ml_stages.model_card import ModelCard
    from airflow_ray_ml_stages.train.config import ENSEMBLE

    return ModelCard(family=ENSEMBLE, feature_columns=list(data.feature_columns), label_column=data.label_column,
                     task=data.task, classes=data.classes, config={"members": members}, seed=data.seed,
                     data_fingerprint=data.data_fingerprint,
                     preprocessor=PREPROCESSOR if data.preprocessor_uri else None, **fields)


def assemble(members: list[dict[str, Any]], target: str, preprocessor_uri: str | None) -> list[dict[str, Any]]:
    """Copy each member's model directory under ``target/members/<i>/`` and the ensemble's preprocessor.

    :param members: the ensemble config's members (``model_dir``, ``weight`` and what the search
        recorded of each).
    :param preprocessor_uri: the preprocessor the ensemble's input features are scaled with (the
        written splits'); each member keeps its own, which may scale differently.
    :return: the members as the ensemble's card lists them: ``dir`` (relative) instead of ``model_dir``.
    """
    from airflow_ray_ml_stages.errors import ArtifactError

    listed = []
    for index, member in enumerate(members):
        source, directory = member["model_dir"], member_dir(index)
        names = artifacts.list_files(source)
        if "model_card.json" not in names:
            raise ArtifactError(f"ensemble member {index} ({source!r}) is not a model directory: it has no "
                                f"model_card.json (files: {names})")
        for name in names:
            artifacts.write_bytes_atomic(artifacts.join(target, directory, name),
                                         artifacts.read_bytes(artifacts.join(source, name)))
        listed.append({**{key: value for key, value in member.items() if key != "model_dir"}, "dir": directory})
    if preprocessor_uri:
        artifacts.write_bytes_atomic(artifacts.join(target, PREPROCESSOR), artifacts.read_bytes(preprocessor_uri))
    return listed
