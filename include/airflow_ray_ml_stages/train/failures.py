"""Which training failures another try cannot fix, so the task fails once instead of on every retry.

A ``ValueError`` or ``TypeError`` from the training code (Lightning refusing a strategy, a config
the library rejects) comes back the same on every try, in the job's process or on every Ray Train
worker. Ray Train reports a worker's error inside its ``WorkerGroupError`` (``worker_failures``:
rank -> the worker's exception); a lost worker (an actor that died, a preempted node) stays
retryable, as does anything else.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, TypeVar

from airflow_ray_ml_stages.errors import RayMLError, TrainingError

log = logging.getLogger("airflow_ray_ml_stages.train")

DETERMINISTIC_ERRORS = (ValueError, TypeError)
Result = TypeVar("Result")


def _is_deterministic(error: BaseException) -> bool:
    if isinstance(error, RayMLError):
        return not error.retryable
    return isinstance(error, DETERMINISTIC_ERRORS)


def not_retryable(error: Exception) -> TrainingError | None:
    """A :class:`TrainingError` for ``error`` if every failure in it is deterministic, else None."""
    worker_failures = getattr(error, "worker_failures", None)  # Ray Train's WorkerGroupError
    causes = dict(worker_failures) if worker_failures else {None: error}
    if not all(_is_deterministic(cause) for cause in causes.values()):
        return None
    cause = next(iter(causes.values()))
    where = f" on Ray Train worker rank(s) {sorted(causes)}" if worker_failures else ""
    text = str(cause).strip()
    text = text if len(text) <= 600 else text[:600] + " ..."
    return TrainingError(f"training failed{where} with {type(cause).__name__}: {text}; another try would fail "
                         "the same way: fix the cause it names (the config, or the installed packages)")


def deterministic_errors_fail_once(run: Callable[..., Result]) -> Callable[..., Result]:
    """``run``, raising a :class:`TrainingError` (not retryable) where :func:`not_retryable` says so."""
    @functools.wraps(run)
    def wrapped(*args, **kwargs) -> Result:
        try:
            return run(*args, **kwargs)
        except RayMLError:
            raise
        except Exception as err:
            final = not_retryable(err)
            if final is None:
                raise
            log.error("training failed with an error a retry cannot fix", exc_info=True)  # its traceback, once
            raise final from err

    return wrapped
