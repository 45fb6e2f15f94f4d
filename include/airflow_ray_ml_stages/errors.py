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
