"""Where a training loop runs: a Ray Train worker, a Ray Tune trial, or the job's own process.

The loops ask their context for rank, world size, a checkpoint to resume from, and where reports go.
"""

from __future__ import annotations

from typing import Any

from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig


class InProcessTrainContext:
    """What the training loops ask of Ray Train, for a run in the job's own process without it.

    It behaves as Train's local mode does (rank 0 of 1, no checkpoint to resume from, a report
    keeps only the last metrics), without importing Ray Train or starting a Train run: at wine
    scale that start-up (importing ``ray.train``, 1.5-3.5 s, plus ``ray.init``) costs about as
    much as the training itself.
    """

    tune = False

    def __init__(self) -> None:
        self.last_metrics: dict[str, Any] | None = None
        self.reports = 0

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation", "test")

    def get_world_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_checkpoint(self):
        return None

    def report(self, metrics: dict[str, Any], checkpoint_directory: str | None = None) -> None:
        self.last_metrics, self.reports = dict(metrics), self.reports + 1


class RayTrainContext:
    """A training loop's view of a Ray Train worker: rank, world size, checkpoints and reports."""

    tune = False

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation", "test")

    def __init__(self) -> None:
        import ray.train

        self._train = ray.train
        self._context = ray.train.get_context()

    def get_world_rank(self) -> int:
        return self._context.get_world_rank()

    def get_world_size(self) -> int:
        return self._context.get_world_size()

    def get_checkpoint(self):
        return self._train.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_directory: str | None = None) -> None:
        from ray.train import Checkpoint

        checkpoint = Checkpoint.from_directory(checkpoint_directory) if checkpoint_directory else None
        self._train.report(metrics, checkpoint=checkpoint)


class TuneTrialContext(InProcessTrainContext):
    """A training loop inside a Ray Tune trial (``cfg.session == "tune"``): rank 0 of 1, always a
    fresh start (a failed trial is recorded, not retried), reports go to Ray Tune, and the test
    split is never looked at: choosing must not see it."""

    tune = True

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation",)


class FoldTrialContext(TuneTrialContext):
    """A cross-validated Tune trial's later folds (``TuneSpec.cv_folds``): as :class:`TuneTrialContext`, but
    nothing goes to Ray Tune. The trial's first fold reports its progress (ASHA's rungs compare
    trials on it); after the last, the trial reports its out-of-fold metrics."""

    tune = False


def loop_context(cfg: TrainLoopConfig, context: Any):
    """The context a training loop was given, else the one its place implies (Tune trial or Train worker)."""
    if context is not None:
        return context
    return TuneTrialContext() if cfg.session == "tune" else RayTrainContext()
