"""How RayHook retries a call that failed for a reason that passes: which failures, how often, how long apart.

A call is retried when it is idempotent (GET, HEAD, PUT, DELETE, OPTIONS; a POST only where the hook
says so, such as a job's stop, or a submit made safe by its deterministic submission id) and it
failed transiently: the connection could not be made or dropped, it timed out, or the dashboard or
a proxy in front of it answered 502, 503 or 504. Anything else (a 4xx, a 500, a TLS certificate
that does not verify) is answered at once. Waits double from one second, with up to a second of
jitter so workers that lost the same dashboard do not come back together, capped at
``max_wait_s``. The connection's ``retries`` and ``retry_max_wait_s`` fields set both
(``airflow_ray_ml.get_provider_info``, which holds their doc and defaults).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Callable

import tenacity

# What a dashboard (or the ingress, load balancer or proxy in front of it) answers while it restarts
# or is overloaded; Ray's own Serve API answers 503 "please retry later" while the GCS recovers.
TRANSIENT_STATUSES = frozenset({502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
FIRST_WAIT_S = 1.0
JITTER_S = 1.0


def _conn_field_default(name: str) -> Any:
    from airflow_ray_ml import get_provider_info

    for connection_type in get_provider_info()["connection-types"]:
        if name in connection_type.get("conn-fields", {}):
            return connection_type["conn-fields"][name]["schema"]["default"]
    raise KeyError(f"no connection field {name!r} is declared")


@dataclass(frozen=True)
class RetryPolicy:
    """How many times a transient failure is retried (0: never) and the longest wait between two tries."""

    retries: int
    max_wait_s: float

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {self.retries!r}")
        if isinstance(self.max_wait_s, bool) or not isinstance(self.max_wait_s, (int, float)) or self.max_wait_s < 0:
            raise ValueError(f"retry_max_wait_s must be a number of seconds >= 0, got {self.max_wait_s!r}")

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> "RetryPolicy":
        """The policy a connection's extra sets; a field left empty takes its declared default."""
        retries, max_wait_s = extra.get("retries"), extra.get("retry_max_wait_s")
        return cls(
            retries=_conn_field_default("retries") if retries in (None, "") else _number(retries, int, "retries"),
            max_wait_s=(_conn_field_default("retry_max_wait_s") if max_wait_s in (None, "")
                        else _number(max_wait_s, float, "retry_max_wait_s")),
        )

    @classmethod
    def default(cls) -> "RetryPolicy":
        return cls.from_extra({})

    @property
    def tries(self) -> int:
        return self.retries + 1

    def _arguments(self, retry: Callable[[tenacity.RetryCallState], bool],
                   before_sleep: Callable[[tenacity.RetryCallState], None] | None) -> dict[str, Any]:
        return {
            "retry": retry,
            "stop": tenacity.stop_after_attempt(self.tries),
            "wait": tenacity.wait_exponential_jitter(initial=FIRST_WAIT_S, max=self.max_wait_s, jitter=JITTER_S),
            "before_sleep": before_sleep,
            "reraise": False,
        }

    def retrying(self, retry: Callable[[tenacity.RetryCallState], bool],
                 before_sleep: Callable[[tenacity.RetryCallState], None] | None = None) -> tenacity.Retrying:
        """A tenacity ``Retrying`` of this policy; ``retry`` says whether an attempt's outcome is transient.

        When every try failed transiently, calling it raises ``tenacity.RetryError`` (its
        ``last_attempt`` holds the last outcome); any other failure is raised as it is, at once.
        """
        return tenacity.Retrying(**self._arguments(retry, before_sleep))

    def a_retrying(self, retry: Callable[[tenacity.RetryCallState], bool],
                   before_sleep: Callable[[tenacity.RetryCallState], None] | None = None) -> tenacity.AsyncRetrying:
        """The async twin of :meth:`retrying` (its waits are ``asyncio.sleep``: a triggerer's loop runs on)."""
        return tenacity.AsyncRetrying(**self._arguments(retry, before_sleep))


def _number(value: Any, kind: type, name: str) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or (kind is int and float(value) != number):
        raise ValueError(f"{name} must be a {'whole number' if kind is int else 'number'}, got {value!r}")
    return number


def is_idempotent(method: str, idempotent: bool | None = None) -> bool:
    """Whether a request may be sent again: by its method, unless the caller says (``idempotent``)."""
    return method.upper() in IDEMPOTENT_METHODS if idempotent is None else idempotent


def is_tls_failure(error: BaseException) -> bool:
    """A certificate or TLS handshake failure, anywhere in the error's chain: another try fails the same way."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or type(seen).__name__ == "SSLError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_transient_error(error: BaseException) -> bool:
    """A connection that could not be made or dropped, or a timeout (requests, httpx); not a TLS failure."""
    import httpx
    import requests

    if is_tls_failure(error):
        return False
    return isinstance(error, (
        requests.exceptions.ConnectionError, requests.exceptions.Timeout, requests.exceptions.ChunkedEncodingError,
        httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError,
    ))


def is_transient(state: tenacity.RetryCallState) -> bool:
    """tenacity's ``retry`` for a plain request: a transient error, or a response with a transient status."""
    outcome = state.outcome
    if outcome is None:
        return False
    if outcome.failed:
        return is_transient_error(outcome.exception())
    return getattr(outcome.result(), "status_code", None) in TRANSIENT_STATUSES
