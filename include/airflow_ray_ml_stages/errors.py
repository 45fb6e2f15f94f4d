"""Errors raised by the Ray-side stages. Each message says what to change.

Each class says whether running the stage again could succeed (``retryable``); the stage's failed
manifest carries it, and the Airflow side fails the task at once where it is False.
"""


class RayMLError(Exception):
    """Base class of every error raised on purpose by the Ray-side package.

    Not retryable: the spec, the data or an artifact must change first.
    """

    retryable = False


class SpecError(RayMLError, ValueError):
    """A stage spec has a missing, unknown or invalid field."""


class DataSourceError(RayMLError, ValueError):
    """A data source cannot be read, or its content is not what the stage needs."""


class ArtifactError(RayMLError, OSError):
    """An artifact cannot be read or written where the spec says it lives."""


class ClusterError(RayMLError, RuntimeError):
    """A local Ray cluster could not be started, reached or stopped (another try may find it)."""

    retryable = True


class TrainingError(RayMLError, RuntimeError):
    """Training failed with an error another try would raise again (a bad config, clashing packages)."""


class TuneError(RayMLError, RuntimeError):
    """A search ended without any trial that completed."""


class ResourcesUnavailableError(RayMLError, RuntimeError):
    """Trials or training workers could not start within the spec's ``resource_wait_s``.

    The message names what holds the cluster's resources and the fixes. Not retryable: another try
    would wait for the same holders.
    """


QUOTE_CHARS = 60
"""The most characters of one value (a cell, a header, a line of a file) that an error message quotes:
enough to recognise it, never a whole line or file."""


def quotable(value):
    """``value`` as an error message may quote it: each text in it (also in lists and dicts) cut to
    ``QUOTE_CHARS`` characters, the cut marked with ``...``."""
    if isinstance(value, str):
        return value if len(value) <= QUOTE_CHARS else value[: QUOTE_CHARS - 3] + "..."
    if isinstance(value, dict):
        return {quotable(key): quotable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [quotable(item) for item in value]
    return value
