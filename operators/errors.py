"""Errors raised by the Airflow side. Each message says what to do about it."""

from airflow_ray_ml.compat import AirflowFailException


class RayOperatorError(Exception):
    """Base class of the errors raised on purpose by the operators, hooks and triggers."""


class InvalidSpecError(RayOperatorError, AirflowFailException):
    """A stage spec built from the task's arguments is invalid: fail at once, retrying cannot help."""


class RayClusterUnreachableError(RayOperatorError, ConnectionError):
    """The Ray dashboard (Jobs/Serve/State API) did not answer."""


class ServeUnreachableError(RayClusterUnreachableError):
    """A Serve application's endpoint (the connection's ``serve_url``) did not answer."""


class RayTLSError(RayOperatorError, AirflowFailException):
    """The server's TLS certificate failed verification: fail at once, another try meets the same
    certificate; the message names the connection's ``verify_tls``."""


class RayConnectionSettingError(RayOperatorError, AirflowFailException):
    """A field of the Ray connection holds a value the hook cannot use: fail at once; fix the connection."""


class RayAuthError(RayOperatorError, PermissionError):
    """The Ray cluster rejected the request's auth token."""


class RayJobFailedError(RayOperatorError, RuntimeError):
    """A stage's Ray job ended FAILED or STOPPED, or wrote a failed manifest."""


class RayStageError(RayJobFailedError, AirflowFailException):
    """A stage failed for a reason another try cannot fix (its manifest says ``retryable: false``): fail at once."""


class RayJobTimeoutError(RayOperatorError, TimeoutError):
    """A stage's Ray job did not finish within the operator's timeout."""


class RayManifestError(RayOperatorError, RuntimeError):
    """A job succeeded but its result manifest could not be read."""


class GPUNotAvailableError(RayOperatorError, RuntimeError):
    """``require_gpu=True`` but the probe found no GPU that CUDA can use."""


class ServeDeployError(RayOperatorError, RuntimeError):
    """A new model failed to deploy or failed its smoke test; the previous config was restored."""


class ServeModelRejectedError(ServeDeployError, AirflowFailException):
    """Serve could not run the model, or it answered the smoke test wrongly: another try would deploy
    the same model and roll it back again, so the task fails at once (a model not ready in time retries)."""


class ServeAppOwnershipError(RayOperatorError, AirflowFailException):
    """The Serve application belongs to another DAG (or to no deploy of this operator): fail at once,
    before anything is changed; retrying cannot help."""


class RayResourcesError(RayOperatorError, AirflowFailException):
    """The request can never run on the cluster (more workers, CPUs or GPUs than it has and can get):
    fail at once, before any job is submitted; retrying cannot help."""


class SourceNotAllowedError(RayOperatorError, AirflowFailException):
    """A source from Params lies outside the allowed roots, or the roots' setting cannot be read: fail at
    once, before any job reads it (airflow_ray_ml.confine)."""


class RayTaskFunctionError(RayOperatorError, AirflowFailException):
    """A ``@task.ray`` function or its arguments cannot travel to the cluster as source and JSON (a lambda,
    a closure, a name from outside the function, an argument that is not JSON): fail at once."""
