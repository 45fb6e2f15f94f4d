"""A model directory's ``model_card.json``: :class:`ModelCard`, what was trained, on what, and how well.

The train stage writes one for every model it trains, the tune stage one for each completed
trial's model (with ``trial_id``, and without the fields only a finished training run has); the
Serve application, batch scoring and the Ray ML page read them with :meth:`ModelCard.read`.

Reading is lenient about fields it does not know (a card written by a newer version still loads)
and strict about the ones it needs: a card without them, or naming an unknown family, raises
:class:`~airflow_ray_ml_stages.errors.ArtifactError` that names the directory and the field.
This module imports neither numpy nor the model libraries, so the Airflow side reads cards cheaply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TASKS
from airflow_ray_ml_stages.errors import ArtifactError
from airflow_ray_ml_stages.train.config import ENSEMBLE, FAMILIES

CARD_FAMILIES = (*FAMILIES, ENSEMBLE)
"""What a card's ``family`` may be: a searchable family, or an ensemble of trained ones."""

MODEL_CARD = "model_card.json"


@dataclass(frozen=True)
class ModelCard:
    """``model_card.json``; fields after ``preprocessor`` are None where the writer had nothing to say."""

    family: str
    """``lightning``, ``xgboost``, ``extra_trees``, ``random_forest``, ``linear`` or ``ensemble``."""
    feature_columns: list[str]
    """The model's inputs after preprocessing, in order."""
    label_column: str
    config: dict[str, Any]
    """Resolved hyperparameters (and ``scaler`` where the config named one); an ensemble's: its
    ``members``, each with its ``dir`` (relative), ``weight``, ``trial_id``, ``family``, ``scaler``,
    ``config`` and ``validation`` metrics."""
    metrics: dict[str, dict[str, float]]
    """Per split (``validation``, and ``test`` for a trained model): the task's metrics
    (:data:`airflow_ray_ml_stages.metrics.TASK_METRICS`)."""
    seed: int
    data_fingerprint: str | None
    """The preprocess stage's fingerprint of the data the model was trained on."""
    preprocessor: str | None
    """The preprocessor's file name in the model directory, or None."""
    task: str = "regression"
    """``regression`` or ``classification``."""
    classes: list[Any] | None = None
    """Classification: the label's values, in the order of the model's class probabilities."""
    model_version: str | None = None
    """``<family>-<UTC time>-<6 hex>``; a trained model's (not a Tune trial's)."""
    trained_at: str | None = None
    """ISO 8601, UTC."""
    baseline: dict[str, float] | None = None
    """The test metrics of a model that ignores the features: the training labels' mean (regression,
    ``test_rmse`` and the mean), or each class's share of them (classification, ``test_log_loss``,
    ``test_accuracy`` and the shares)."""
    compute: dict[str, Any] | None = None
    """What the run used: GPU or CPU, workers, data loading, the fallback and right-sizing reasons."""
    training: dict[str, Any] | None = None
    """What the loop ran: epochs or rounds, restarts, run name, times."""
    framework_versions: dict[str, str] | None = None
    trial_id: str | None = None
    """The Ray Tune trial that trained the model (a Tune trial's card)."""
    input_types: dict[str, str] | None = None
    """The raw input columns the model takes (its preprocessor's), each with its type: ``number``,
    ``boolean`` or ``category``."""

    def to_dict(self) -> dict[str, Any]:
        """The card as JSON data: every field up to ``preprocessor``, the later ones where set."""
        data = dataclasses.asdict(self)
        optional = {field.name for field in dataclasses.fields(self) if field.default is None}
        return {key: value for key, value in data.items() if key not in optional or value is not None}

    def write(self, model_dir: str) -> None:
        artifacts.write_json_atomic(artifacts.join(model_dir, MODEL_CARD), self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, where: str = "model card") -> ModelCard:
        """A card from its JSON data; ArtifactError naming ``where`` and the field if it lacks a needed one."""
        if not isinstance(data, dict):
            raise ArtifactError(f"{where} is not a JSON object")
        fields = dataclasses.fields(cls)
        missing = [field.name for field in fields if field.default is dataclasses.MISSING and field.name not in data]
        if missing:
            raise ArtifactError(f"{where} lacks field(s) {missing}; was it written by the train or tune stage?")
        if data.get("task", "regression") not in TASKS:
            raise ArtifactError(f"{where} names an unknown task {data['task']!r}; expected one of {list(TASKS)}")
        if data["family"] not in CARD_FAMILIES:
            raise ArtifactError(f"{where} names an unknown family {data['family']!r}; expected one of "
                                f"{list(CARD_FAMILIES)}")
        return cls(**{field.name: data[field.name] for field in fields if field.name in data})

    @classmethod
    def read(cls, model_dir: str) -> ModelCard:
        """The card of a model directory (local path or object-store URI)."""
        uri = artifacts.join(model_dir, MODEL_CARD)
        if not artifacts.exists(uri):
            raise ArtifactError(f"{model_dir!r} is not a model directory (no {MODEL_CARD}); pass the model_dir "
                                "of a train task's XCom or of the served model")
        return cls.from_dict(artifacts.read_json(uri), f"model card {uri!r}")
