"""What a training loop is given: :class:`TrainLoopConfig`, one typed field per setting.

The train stage builds one for its run and the tune stage one per trial; the loops
(:mod:`airflow_ray_ml_stages.train.loops`) and the helpers they call read only its fields. Ray
Train hands a loop its ``train_loop_config`` as a plain dict, so the stage passes
:meth:`TrainLoopConfig.to_dict` and the loop turns it back with :meth:`TrainLoopConfig.of`, which
rejects a dict with missing or unknown keys by name.

The model's hyperparameters (``config``) stay a dict: each family has its own, checked by
:func:`airflow_ray_ml_stages.train.config.resolve_train_config`, and XGBoost takes booster
parameters beyond the ones this project names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from airflow_ray_ml_stages.constants import task_of

DataLoading = Literal["direct", "ray_data"]
Session = Literal["train", "tune"]


@dataclass(frozen=True)
class TrainLoopConfig:
    """A training loop's settings (one run of the train stage, or one Tune trial)."""

    config: dict[str, Any]
    """Resolved hyperparameters, ``family`` included (see ``resolve_train_config``)."""
    feature_columns: list[str]
    label_column: str
    label_mean: float
    """The training split's label mean: for regression the MLP's output offset and XGBoost's ``base_score``."""
    label_std: float
    """The training split's label std: for regression the MLP's output scale (see ``models.mlp.label_scale``)."""
    seed: int
    use_gpu: bool
    local_mode: bool
    """True where the loop runs without Ray Train workers (the job's process, a Tune trial, Train's local mode)."""
    threads: int
    """Threads for torch or XGBoost in this process."""
    checkpoint_every: int | None
    """Checkpoint and report every this many epochs or rounds; None: see :meth:`checkpoint_interval`."""
    artifact_dir: str
    """The run's directory: evaluation files, worker records (see ``run_dir``)."""
    model_dir: str
    """Where rank 0 writes the model's weights."""
    uris: dict[str, str]
    """Split name (train, validation, test) to its Parquet URI."""
    data_loading: DataLoading
    """``direct``: read the splits with pyarrow; ``ray_data``: the Ray Dataset shard Ray Train hands the worker."""
    feature_affine: list[list[float]] | None = None
    """``[multiply, add]`` per feature: maps the written splits to another scaler's scaling."""
    feature_fill: list[float] | None = None
    """Per feature, the value of a missing one (NaN in the splits, ``nan_policy='impute'``) in the written
    splits' scaling, filled before ``feature_affine``; None: left as NaN (XGBoost takes it as missing)."""
    session: Session = "train"
    """``tune`` inside a Ray Tune trial: reports go to Tune and the test split is never read."""
    class_priors: list[float] | None = None
    """Classification: each class's share of the training split (the MLP's output offset, as logs);
    None: regression."""

    @property
    def family(self) -> str:
        return self.config["family"]

    @property
    def task(self) -> str:
        return task_of(self.class_priors)

    def checkpoint_interval(self) -> int:
        """Checkpoint (and report) every this many epochs or rounds: the setting, else every epoch or a tenth
        of the rounds. A forest neither checkpoints nor reports before its end."""
        if self.checkpoint_every:
            return self.checkpoint_every
        if self.family == "xgboost":
            return max(1, self.config["num_boost_round"] // 10)
        return 1

    def to_dict(self) -> dict[str, Any]:
        """The plain dict Ray Train's ``train_loop_config`` carries to the workers."""
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, value: TrainLoopConfig | dict[str, Any]) -> TrainLoopConfig:
        """``value`` itself, or the config a :meth:`to_dict` dict holds; TypeError naming missing or unknown keys."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"a training loop takes a TrainLoopConfig or its dict, got {type(value).__name__}")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        required = {name for name, field in fields.items()
                    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING}
        unknown, missing = sorted(set(value) - set(fields)), sorted(required - set(value))
        if unknown or missing:
            raise TypeError(f"training loop config: missing {missing}, unknown {unknown}")
        return cls(**value)
