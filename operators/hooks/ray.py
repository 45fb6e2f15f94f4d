"""RayHook: an Airflow connection to a Ray cluster's dashboard (Jobs, Serve and State REST APIs)
and to the Serve endpoints of the applications this project deploys.

The hook is the only place that knows the dashboard's and the endpoints' routes: each endpoint is
one constant below and each call one method; the calls a trigger makes have ``a_``-prefixed async
twins. Every synchronous request, the dashboard's and the endpoints', goes out through
:meth:`RayHook._send_once`, with the connection's TLS verification and the hook's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import queue
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import requests
import tenacity

from airflow_ray_ml import CONN_TYPE, CONN_TYPE_NAME
from airflow_ray_ml.errors import (
    RayAuthError, RayClusterUnreachableError, RayConnectionSettingError, RayOperatorError, RayTLSError,
    ServeUnreachableError,
)
from airflow_ray_ml.hooks.retry import (
    TRANSIENT_STATUSES, RetryPolicy, is_idempotent, is_tls_failure, is_transient, is_transient_error,
)
from airflow_ray_ml.job_status import RayJobStatus
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.capacity import Capacity
from airflow_ray_ml_stages.constants import DEFAULT_ARTIFACT_ROOT_ENV

try:
    from airflow.sdk import BaseHook
except ImportError:  # pragma: no cover - Airflow 2 layout, kept for readers on older images
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]

DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8265"
DEFAULT_TIMEOUT_S = 30.0

# The Ray dashboard's REST routes (Ray 2.x), relative to the dashboard URL.
VERSION_ENDPOINT = "/api/version"
JOBS_ENDPOINT = "/api/jobs/"
JOB_ENDPOINT = "/api/jobs/{submission_id}"
JOB_STOP_ENDPOINT = "/api/jobs/{submission_id}/stop"
JOB_LOGS_ENDPOINT = "/api/jobs/{submission_id}/logs"
# A websocket: the only route that gives a job's log as it grows (the one above returns it whole).
JOB_LOGS_TAIL_ENDPOINT = "/api/jobs/{submission_id}/logs/tail"
SERVE_APPLICATIONS_ENDPOINT = "/api/serve/applications/"
NODES_ENDPOINT = "/api/v0/nodes"
NODES_PARAMS = {"detail": "1", "limit": "1000"}
# The autoscaler's last report (what `ray status` prints), as the monitor on the head writes it.
CLUSTER_STATUS_ENDPOINT = "/api/cluster_status"
# A Serve application's routes (airflow_ray_ml_stages.serve), under its route prefix at the
# connection's serve_url. They take the application's API key, never the cluster's token.
SERVE_HEALTH_ENDPOINT = "{route_prefix}/health"
SERVE_METADATA_ENDPOINT = "{route_prefix}/metadata"
SERVE_PREDICT_ENDPOINT = "{route_prefix}/predict"
SERVE_ROLLOUT_ENDPOINT = "{route_prefix}/rollout"
# Pings on the log websocket: a connection that died without closing (a dropped NAT or proxy
# entry) fails within two of these instead of leaving the follower waiting for lines forever.
LOG_STREAM_HEARTBEAT_S = 30.0
# How often a follower of a job's log also reads the job's state (a_tail_job_logs).
STATUS_POLL_S = 1.0
# How long closing the log websocket waits for the dashboard's answer: Ray's end never reads from
# it, so a follower that leaves first (the job has ended, or its wait is over) would otherwise
# wait until the dashboard ends the stream itself, seconds later.
LOG_STREAM_CLOSE_S = 0.1
# How long a sync follower that leaves waits for its reader thread to close the stream.
LOG_READER_JOIN_S = 5.0
# What a log reader thread sends last (with the error that ended the stream, or None).
_LOG_END = object()
TOKEN_FILE = Path.home() / ".ray" / "auth_token"
HOW_TO_FIX = (
    "start a local cluster with `make run` (or `ray start --head --dashboard-host=127.0.0.1`), "
    "or point the Airflow connection '{conn_id}' at your cluster's dashboard URL"
)


def _ws_close_timeout(aiohttp: Any) -> Any:
    """``ws_connect``'s timeout: LOG_STREAM_CLOSE_S to close (aiohttp before 3.11 takes it as a number)."""
    settings = getattr(aiohttp, "ClientWSTimeout", None)
    return LOG_STREAM_CLOSE_S if settings is None else settings(ws_receive=None, ws_close=LOG_STREAM_CLOSE_S)


def _run_until_complete(loop: asyncio.AbstractEventLoop, main: asyncio.Task) -> None:
    """A log reader thread's body: run ``main`` in ``loop``, then close the loop as asyncio.run would."""
    try:
        loop.run_until_complete(main)
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def normalise_dashboard_url(host: str, port: int | None = None, scheme: str = "http") -> str:
    """Turn a connection's host (a bare host or a full URL) and port into ``scheme://host:port``."""
    host = host.strip().rstrip("/")
    if "://" not in host:
        host = f"{scheme}://{host}"
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https"):
        raise RayOperatorError(
            f"the Ray dashboard URL {host!r} must start with http:// or https:// (got {parts.scheme!r})"
        )
    if parts.port is None and port:
        host = f"{parts.scheme}://{parts.hostname}:{port}{parts.path}"
    elif parts.port is None:
        host = f"{parts.scheme}://{parts.hostname}:8265{parts.path}"
    return host


def resolve_token(connection_token: str | None, environ: dict[str, str] | None = None,
                  token_file: Path | None = None) -> str | None:
    """Pick the auth token: the connection's, then ``RAY_AUTH_TOKEN``, then the token file.

    The file is ``RAY_AUTH_TOKEN_PATH`` when set, else ``~/.ray/auth_token`` (where a local
    ``ray.init()`` writes it). Returns None when no token exists (a cluster without token auth).
    """
    environ = os.environ if environ is None else environ
    if connection_token and connection_token.strip():
        return connection_token.strip()
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return environ["RAY_AUTH_TOKEN"].strip()
    path = Path(environ["RAY_AUTH_TOKEN_PATH"]) if environ.get("RAY_AUTH_TOKEN_PATH") else token_file
    path = TOKEN_FILE if path is None else path
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return token or None


def _last_lines(text: str, lines: int = 15, max_chars: int = 1500) -> str:
    """The end of a long error body: a Python traceback names its cause in its last lines."""
    kept = [line for line in text.splitlines() if line.strip()]
    tail = "\n".join(kept[-lines:])[-max_chars:]
    return tail if len(kept) <= lines and len(tail) < max_chars else f"...\n{tail}"


def _ray_logs_to_task_log() -> None:
    """Let the Ray client's log records reach the task log at their own level.

    Importing ray gives its ``ray`` logger a handler of its own on stderr and stops propagation;
    Airflow records what a task writes to stderr at error level, so the client's INFO lines
    ("Uploading package ...") would read as errors. Propagated, they take the task's handlers.
    """
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            ray_logger.removeHandler(handler)
    ray_logger.propagate = True


def _tls_reason(err: BaseException) -> str:
    """What the TLS layer said, found among the exceptions ``err`` wraps (requests nests urllib3's, which nests ssl's)."""
    todo, seen = [err], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            detail = getattr(current, "verify_message", None)
            return f"certificate verify failed: {detail}" if detail else str(current.reason or current)[:200]
        todo += [arg for arg in current.args if isinstance(arg, BaseException)]
        todo += [link for link in (getattr(current, "reason", None), current.__cause__, current.__context__)
                 if isinstance(link, BaseException)]
    return type(err).__name__


def _as_bool(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() not in ("false", "0", "no", "off")


def _job_path(template: str, submission_id: str) -> str:
    return template.format(submission_id=quote(submission_id, safe=""))


def _without_credentials(url: str) -> str:
    """The URL as an error message may quote it: without a ``user:password@`` part."""
    parts = urlsplit(url)
    return url if "@" not in parts.netloc else parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]).geturl()


# How Ray's job client words a refused request (ray.dashboard.modules.dashboard_sdk): its status code.
_RAY_CLIENT_STATUS = re.compile(r"^Request failed with status code (\d{3})\b")


def _ray_client_status(error: BaseException) -> int | None:
    match = _RAY_CLIENT_STATUS.match(str(error)) if isinstance(error, RuntimeError) else None
    return int(match[1]) if match else None


def _is_transient_submit(state: tenacity.RetryCallState) -> bool:
    """tenacity's ``retry`` for a submit through Ray's client: no connection, a timeout, or a 502/503/504."""
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return False
    error = outcome.exception()
    return is_transient_error(error) or _ray_client_status(error) in TRANSIENT_STATUSES


def _tries(count: int) -> str:
    return "1 try" if count == 1 else f"{count} tries"


@lru_cache(maxsize=4)
def _tls_context(bundle: str | None, cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """The verifying TLS context of this process's async calls, made once per CA bundle: loading the
    CAs takes tens of milliseconds of CPU, which a new client per call paid on every job-status
    poll, even to an ``http://`` dashboard.

    It trusts what the sync calls (requests) trust, so a trigger verifies as its task did: ``bundle``
    (``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``), a file or a directory; without it, what httpx
    would read (``cert_file``, else ``cert_dir``: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), else
    certifi's bundle."""
    if bundle:
        return ssl.create_default_context(**{"capath" if os.path.isdir(bundle) else "cafile": bundle})
    if cert_file or cert_dir:
        return ssl.create_default_context(**({"cafile": cert_file} if cert_file else {"capath": cert_dir}))
    return httpx.create_ssl_context(verify=True, trust_env=False)


def _async_verify(verify_tls: bool) -> ssl.SSLContext | bool:
    """httpx's ``verify`` for the connection's ``verify_tls``: the CAs trusted now, or no verification."""
    if not verify_tls:
        return False
    environ = os.environ
    return _tls_context(environ.get("REQUESTS_CA_BUNDLE") or environ.get("CURL_CA_BUNDLE"),
                        environ.get("SSL_CERT_FILE"), environ.get("SSL_CERT_DIR"))


class RayHook(BaseHook):
    """Talk to a Ray cluster through its dashboard's REST APIs.

    The connection (type ``ray_ml``) gives the dashboard URL (``dashboard_url`` field, or host and
    port), the auth token (``auth_token`` field or password; else ``RAY_AUTH_TOKEN``, else
    ``~/.ray/auth_token``), whether to verify TLS (on by default), the artifact root, and how
    calls that failed transiently are retried (``retries``, ``retry_max_wait_s``;
    :mod:`airflow_ray_ml.hooks.retry`). When the default connection ``ray_default`` is not
    defined, the hook uses ``RAY_DASHBOARD_URL`` or ``http://127.0.0.1:8265``, the embedded local
    cluster, with the default retries.

    The REST calls have async twins for triggers (``a_get_job_status``, ``a_stop_job``,
    ``a_tail_job_logs``...; httpx, and aiohttp for the log websocket) that answer the same.

    :param ray_conn_id: the Airflow connection id.
    :param timeout_s: seconds one request may take.
    :param retries: instead of the connection's ``retries``, for a caller that cannot wait (a
        page a person is loading: 0) or that polls on its own.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = CONN_TYPE
    hook_name = CONN_TYPE_NAME

    def __init__(self, ray_conn_id: str = default_conn_name, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.timeout_s = timeout_s
        self.retries = retries

    # -- the connection -----------------------------------------------------------------------

    def _undefined_default(self, err: Exception) -> bool:
        return self.ray_conn_id == self.default_conn_name and "isn't defined" in str(err)

    def _local_settings(self) -> dict[str, Any]:
        self.log.info("Connection %r is not defined; using the local Ray cluster", self.ray_conn_id)
        return {
            "dashboard_url": normalise_dashboard_url(os.environ.get("RAY_DASHBOARD_URL", DEFAULT_DASHBOARD_URL)),
            "token": None,
            "verify_tls": True,
            "artifact_root": None,
            "serve_url": None,
            "storage_conn_id": None,
            "allowed_sources": None,
            "retry_policy": RetryPolicy.default(),
        }

    def _connection_settings(self, connection: Any) -> dict[str, Any]:
        if connection.conn_type != CONN_TYPE:
            # Read all the same (connections are found by id), but Airflow's form and test button
            # know this type only as another provider's, or not at all.
            self.log.warning("Connection %r has type %r; change it to %r (docs/deployment.md#the-connection-type-ray_ml)",
                             self.ray_conn_id, connection.conn_type, CONN_TYPE)
        extra = connection.extra_dejson or {}
        url = extra.get("dashboard_url") or connection.host
        if not url:
            raise RayOperatorError(
                f"the Airflow connection {self.ray_conn_id!r} has no dashboard URL: set its "
                f"'dashboard_url' field (or host) to something like {DEFAULT_DASHBOARD_URL}"
            )
        try:
            retry_policy = RetryPolicy.from_extra(extra)
        except ValueError as err:
            raise RayConnectionSettingError(
                f"the Airflow connection {self.ray_conn_id!r}: {err}; fix the field or leave it empty for its default"
            ) from None
        return {
            "dashboard_url": normalise_dashboard_url(url, connection.port, connection.schema or "http"),
            "token": extra.get("auth_token") or connection.password,
            "verify_tls": _as_bool(extra.get("verify_tls"), True),
            "artifact_root": extra.get("artifact_root") or None,
            "serve_url": extra.get("serve_url") or None,
            "storage_conn_id": extra.get("storage_conn_id") or None,
            "allowed_sources": extra.get("allowed_sources") or None,
            "retry_policy": retry_policy,
        }

    @cached_property
    def _settings(self) -> dict[str, Any]:
        try:
            connection = self.get_connection(self.ray_conn_id)
        except Exception as err:
            if not self._undefined_default(err):
                raise
            return self._local_settings()
        settings = self._connection_settings(connection)
        if settings["storage_conn_id"]:
            self._use_storage_connection(settings["storage_conn_id"], settings["artifact_root"])
        return settings

    def _use_storage_connection(self, conn_id: str, artifact_root: str | None) -> None:
        """Read and write the artifact root in this process with the storage connection's S3 credentials.

        They serve the ``s3://`` artifact root (``artifacts.use_s3_credentials``' prefix), or every
        ``s3://`` URI where the root is not on S3; other connections' roots keep their own.

        The connection has the ``aws`` shape: access key id as login (or extra ``aws_access_key_id``),
        secret as password (or ``aws_secret_access_key``), and in its extra ``aws_session_token``,
        ``region_name`` and ``endpoint_url`` (or ``service_config.s3.endpoint_url``). Only Airflow
        uses it: a stage job or a Serve replica reads the store with its Ray node's own identity,
        so the secret never travels in a job's entrypoint, runtime_env or metadata.
        """
        try:
            connection = self.get_connection(conn_id)
        except Exception as err:
            raise RayOperatorError(
                f"the Ray connection {self.ray_conn_id!r} names the storage connection {conn_id!r}, "
                f"which cannot be read: {err}. Define it (an aws connection) or clear 'storage_conn_id'"
            ) from None
        extra = connection.extra_dejson or {}
        endpoint = extra.get("endpoint_url") or ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
        artifacts.use_s3_credentials(
            connection.login or extra.get("aws_access_key_id"),
            connection.password or extra.get("aws_secret_access_key"),
            session_token=extra.get("aws_session_token"), region=extra.get("region_name"),
            endpoint_url=endpoint,
            prefix=artifact_root if artifact_root and artifact_root.startswith("s3://") else "s3://",
        )

    async def _a_load_settings(self) -> None:
        """Read the connection without blocking the event loop (the triggerer's is shared)."""
        if "_settings" in self.__dict__:
            return
        try:
            connection = await self.aget_connection(self.ray_conn_id)
        except Exception as err:
            if not self._undefined_default(err):
                raise
            settings = self._local_settings()
        else:
            settings = self._connection_settings(connection)
        self.__dict__["_settings"] = settings

    @property
    def dashboard_url(self) -> str:
        return self._settings["dashboard_url"]

    @property
    def verify_tls(self) -> bool:
        return self._settings["verify_tls"]

    @property
    def serve_url(self) -> str:
        """Ray Serve's HTTP address: the connection's ``serve_url``, else the dashboard host, port 8000."""
        if self._settings["serve_url"]:
            return self._settings["serve_url"].rstrip("/")
        parts = urlsplit(self.dashboard_url)
        return f"{parts.scheme}://{parts.hostname}:8000"

    @property
    def artifact_root(self) -> str | None:
        """The connection's artifact root, else ``RAYML_ARTIFACT_ROOT``; None when neither is set."""
        return self._settings["artifact_root"] or os.environ.get(DEFAULT_ARTIFACT_ROOT_ENV) or None

    @property
    def allowed_sources(self) -> str | list[str] | None:
        """The connection's ``allowed_sources`` as given (airflow_ray_ml.confine reads it)."""
        return self._settings["allowed_sources"]

    @property
    def retry_policy(self) -> RetryPolicy:
        """How transient failures are retried: the connection's fields, or this hook's ``retries``."""
        policy = self._settings["retry_policy"]
        return policy if self.retries is None else RetryPolicy(self.retries, policy.max_wait_s)

    def get_token(self) -> str | None:
        return resolve_token(self._settings["token"])

    def auth_headers(self) -> dict[str, str]:
        token = self.get_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    # -- plain HTTP, sync and async -----------------------------------------------------------

    def unreachable_message(self, detail: object) -> str:
        return (
            f"Cannot reach the Ray cluster at {_without_credentials(self.dashboard_url)} ({detail}): "
            + HOW_TO_FIX.format(conn_id=self.ray_conn_id)
            + "."
        )

    def _raise_for_auth(self, status_code: int, text: str) -> None:
        if status_code in (401, 403):
            raise RayAuthError(
                f"The Ray cluster at {self.dashboard_url} rejected the request "
                f"(HTTP {status_code}: {text.strip()[:120]}): set the cluster's "
                f"auth token in the connection {self.ray_conn_id!r} (auth token field or password), "
                "in RAY_AUTH_TOKEN, or in ~/.ray/auth_token."
            )

    def check_response(self, response: requests.Response | httpx.Response) -> Any:
        """Turn auth failures into :class:`RayAuthError` with the fix; leave other codes to callers."""
        self._raise_for_auth(response.status_code, response.text)
        return response

    def _json_of(self, method: str, path: str, response: requests.Response | httpx.Response) -> Any:
        if response.status_code >= 400:
            raise RayOperatorError(
                f"{method} {self.dashboard_url}{path} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        return response.json()

    def tls_message(self, url: str, err: Exception) -> str:
        return (
            f"TLS verification of {url} failed ({_tls_reason(err)}): give the server a certificate your CA "
            f"bundle trusts (REQUESTS_CA_BUNDLE), or set verify_tls to false in the connection "
            f"{self.ray_conn_id!r} to accept an unverified one."
        )

    def _send_once(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """Send one request with the connection's TLS verification and the hook's timeout; a
        certificate that fails verification raises :class:`RayTLSError` (never retried)."""
        kwargs.setdefault("timeout", self.timeout_s)
        try:
            return requests.request(method, url, verify=self.verify_tls, **kwargs)
        except requests.exceptions.SSLError as err:
            raise RayTLSError(self.tls_message(url, err)) from None

    def send(self, method: str, url: str, *, unreachable: Callable[[str], Exception], **kwargs: Any) -> requests.Response:
        """Send one request, as :meth:`_send_once`; no answer at all raises ``unreachable(<the reason>)``.

        The endpoints' calls come through here; the dashboard's through :meth:`request`, which
        adds the token and the retries around the same :meth:`_send_once`.
        """
        try:
            return self._send_once(method, url, **kwargs)
        except requests.exceptions.RequestException as err:
            raise unreachable(type(err).__name__) from None

    def _log_retry(self, method: str, path: str) -> Any:
        """tenacity's ``before_sleep``: one warning per failed try, naming what failed and the next wait."""
        def log(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            error = outcome.exception() if outcome is not None and outcome.failed else None
            status = _ray_client_status(error) if error is not None else getattr(outcome.result(), "status_code", None)
            what = f"HTTP {status}" if status else type(error).__name__
            self.log.warning("%s %s%s: %s (try %d of %d); trying again in %.1f s", method,
                             _without_credentials(self.dashboard_url), path, what, state.attempt_number,
                             self.retry_policy.tries, state.next_action.sleep if state.next_action else 0.0)
        return log

    def _exhausted(self, method: str, path: str, attempt: tenacity.Future, started: float) -> RayClusterUnreachableError:
        """The one error for a call whose every try failed transiently: the URL, the tries, the last failure."""
        tries, elapsed = _tries(attempt.attempt_number), time.monotonic() - started
        if attempt.failed:
            error = attempt.exception()
            status, text = _ray_client_status(error), str(error)
            if status is None:
                return RayClusterUnreachableError(self.unreachable_message(
                    f"{type(error).__name__} on {method} {path}, {tries} in {elapsed:.0f} s"))
        else:
            status, text = attempt.result().status_code, attempt.result().text
        return RayClusterUnreachableError(
            f"{method} {_without_credentials(self.dashboard_url)}{path} answered HTTP {status} on {tries} in "
            f"{elapsed:.0f} s ({text.strip()[:200]}): the Ray dashboard, or a proxy in front of it, is restarting "
            f"or overloaded. Try again later, or give the connection {self.ray_conn_id!r} more 'retries' or a "
            "longer 'retry_max_wait_s'."
        )

    def request(self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any) -> requests.Response:
        """Send an authenticated request to the dashboard; unreachable clusters raise one clear error.

        An idempotent request (by its method, or ``idempotent=True`` for a POST that is safe to
        repeat) that fails transiently is retried as the connection says
        (:mod:`airflow_ray_ml.hooks.retry`); when every try failed, it raises
        :class:`RayClusterUnreachableError` naming the URL and the tries. Other requests are sent once.
        """
        headers = {**self.auth_headers(), **kwargs.pop("headers", {})}
        url = f"{self.dashboard_url}{path}"

        def send() -> requests.Response:
            return self._send_once(method, url, headers=headers, **kwargs)

        started = time.monotonic()
        try:
            if is_idempotent(method, idempotent):
                response = self.retry_policy.retrying(is_transient, self._log_retry(method, path))(send)
            else:
                response = send()
        except tenacity.RetryError as exhausted:
            raise self._exhausted(method, path, exhausted.last_attempt, started) from None
        except requests.exceptions.RequestException as err:
            raise RayClusterUnreachableError(self.unreachable_message(type(err).__name__)) from None
        return self.check_response(response)

    async def a_request(self, method: str, path: str, *, idempotent: bool | None = None,
                        **kwargs: Any) -> httpx.Response:
        """Async twin of :meth:`request` (httpx), with the same retries (waiting without blocking the loop)."""
        await self._a_load_settings()
        headers = {**self.auth_headers(), **kwargs.pop("headers", {})}
        url = f"{self.dashboard_url}{path}"

        async def send() -> httpx.Response:
            # A client per call: triggers call rarely (see a_tail_job_logs), and a client is bound
            # to the event loop that made it; the TLS context is the process's one.
            async with httpx.AsyncClient(verify=_async_verify(self.verify_tls), timeout=self.timeout_s) as client:
                return await client.request(method, url, headers=headers, **kwargs)

        started = time.monotonic()
        try:
            if is_idempotent(method, idempotent):
                response = await self.retry_policy.a_retrying(is_transient, self._log_retry(method, path))(send)
            else:
                response = await send()
        except tenacity.RetryError as exhausted:
            raise self._exhausted(method, path, exhausted.last_attempt, started) from None
        except httpx.HTTPError as err:
            if is_tls_failure(err):
                raise RayTLSError(self.tls_message(url, err)) from None
            raise RayClusterUnreachableError(self.unreachable_message(type(err).__name__)) from None
        return self.check_response(response)

    def get_json(self, path: str, **kwargs: Any) -> Any:
        return self._json_of("GET", path, self.request("GET", path, **kwargs))

    async def a_get_json(self, path: str, **kwargs: Any) -> Any:
        return self._json_of("GET", path, await self.a_request("GET", path, **kwargs))

    # -- cluster ------------------------------------------------------------------------------

    def get_version(self) -> dict[str, Any]:
        return self.get_json(VERSION_ENDPOINT)

    async def a_get_version(self) -> dict[str, Any]:
        return await self.a_get_json(VERSION_ENDPOINT)

    def check_access(self) -> None:
        """Raise a clear error unless the cluster answers and accepts the token."""
        self.get_version()
        self._check_jobs_api(self.request("GET", JOBS_ENDPOINT))

    def _check_jobs_api(self, response: requests.Response | httpx.Response) -> None:
        if response.status_code >= 400:
            raise RayOperatorError(
                f"The Ray Jobs API at {self.dashboard_url} answered HTTP {response.status_code}; "
                "is this a Ray dashboard with the job module enabled?"
            )

    def get_nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes as the State API lists them (``node_id``, ``state``, ``resources_total``...)."""
        return _state_result(self.get_json(NODES_ENDPOINT, params=NODES_PARAMS))

    async def a_get_nodes(self) -> list[dict[str, Any]]:
        return _state_result(await self.a_get_json(NODES_ENDPOINT, params=NODES_PARAMS))

    def get_cluster_resources(self) -> dict[str, Any]:
        """Per-node resources from the State API: ``{node_id: {"total": {...}, "state": ...}}``."""
        return {
            node["node_id"]: {
                "total": node.get("resources_total", {}),
                "state": node.get("state"),
                "address": node.get("node_ip"),
                "labels": node.get("labels", {}),
            }
            for node in self.get_nodes()
        }

    def get_cluster_status(self) -> dict[str, Any]:
        """The autoscaler's report (``autoscalingStatus``, ``clusterStatus``...); empty keys where none runs."""
        return self.get_json(CLUSTER_STATUS_ENDPOINT).get("data") or {}

    def get_capacity(self) -> Capacity:
        """The cluster's nodes' totals (a static cluster's capacity) and whether an autoscaler may add nodes."""
        nodes = self.get_nodes()
        return Capacity.of_nodes(nodes, autoscaling=cluster_autoscales(self.get_cluster_status()))

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button."""
        try:
            self.check_access()
            version = self.get_version()
        except RayOperatorError as err:
            return False, str(err)
        return True, f"Connected to Ray {version.get('ray_version', '?')} at {self.dashboard_url}"

    # -- jobs ---------------------------------------------------------------------------------

    def get_job_client(self):
        """A Ray ``JobSubmissionClient`` carrying the auth header, after checking the cluster answers."""
        from ray.job_submission import JobSubmissionClient

        _ray_logs_to_task_log()
        self.check_access()
        try:
            return JobSubmissionClient(
                self.dashboard_url, headers=self.auth_headers(), verify=self.verify_tls
            )
        except ConnectionError as err:
            raise RayClusterUnreachableError(self.unreachable_message(err)) from None

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict[str, Any] | None = None,
                   metadata: dict[str, str] | None = None, **resources: Any) -> str:
        """Submit a job through Ray's client (which uploads the runtime_env's local packages first).

        ``resources``: what the entrypoint's process reserves (``entrypoint_num_cpus``,
        ``entrypoint_num_gpus``, ``entrypoint_memory``, ``entrypoint_resources``). Raises Ray's
        ``RuntimeError`` when the cluster refuses it, e.g. when ``submission_id`` already exists.

        A submit that failed transiently is retried like an idempotent request: the submission id
        makes it one. When a retry hears "already exists", an earlier try of this call reached Ray
        (only its answer was lost): that job is this call's, and its id is returned.
        """
        client = self.get_job_client()
        started = time.monotonic()
        try:
            for attempt in self.retry_policy.retrying(_is_transient_submit, self._log_retry("POST", JOBS_ENDPOINT)):
                with attempt:
                    try:
                        # a copy per try: Ray's client swaps the runtime_env's local paths for package URIs
                        return client.submit_job(
                            entrypoint=entrypoint, submission_id=submission_id, runtime_env=copy.deepcopy(runtime_env),
                            metadata=metadata, **resources,
                        )
                    except RuntimeError as err:
                        if attempt.retry_state.attempt_number > 1 and "already exists" in str(err):
                            self.log.info("Ray job %s was submitted by an earlier try whose answer was lost; "
                                          "it is this submit's job", submission_id)
                            return submission_id
                        raise
        except tenacity.RetryError as exhausted:
            raise self._exhausted("POST", JOBS_ENDPOINT, exhausted.last_attempt, started) from None
        except requests.exceptions.RequestException as err:
            raise RayClusterUnreachableError(self.unreachable_message(type(err).__name__)) from None
        raise AssertionError("unreachable: tenacity either returns an attempt's result or raises")

    def list_jobs(self) -> list[dict[str, Any]]:
        """Every job the cluster knows (submitted or driver jobs), as the Jobs API describes them."""
        return self.get_json(JOBS_ENDPOINT)

    async def a_list_jobs(self) -> list[dict[str, Any]]:
        return await self.a_get_json(JOBS_ENDPOINT)

    def _job_info_of(self, submission_id: str, response: requests.Response | httpx.Response) -> dict[str, Any] | None:
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise RayOperatorError(
                f"the Ray Jobs API answered HTTP {response.status_code} for job {submission_id}: "
                f"{response.text[:300]}"
            )
        return response.json()

    def get_job_info(self, submission_id: str) -> dict[str, Any] | None:
        """The job's details (``status``, ``message``, ``metadata``...); None when no such job exists."""
        return self._job_info_of(submission_id, self.request("GET", _job_path(JOB_ENDPOINT, submission_id)))

    async def a_get_job_info(self, submission_id: str) -> dict[str, Any] | None:
        return self._job_info_of(submission_id, await self.a_request("GET", _job_path(JOB_ENDPOINT, submission_id)))

    def get_job_status(self, submission_id: str) -> RayJobStatus | None:
        """The job's state; None when no such job exists."""
        info = self.get_job_info(submission_id)
        return None if info is None else RayJobStatus(info["status"])

    async def a_get_job_status(self, submission_id: str) -> RayJobStatus | None:
        info = await self.a_get_job_info(submission_id)
        return None if info is None else RayJobStatus(info["status"])

    def _stopped(self, submission_id: str, response: requests.Response | httpx.Response) -> bool:
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise RayOperatorError(
                f"Ray did not stop job {submission_id} (HTTP {response.status_code}: {response.text[:300]})"
            )
        return bool(response.json().get("stopped"))

    def stop_job(self, submission_id: str) -> bool:
        """Ask Ray to stop the job; False when it had already ended or does not exist.

        Retried like an idempotent call (stopping a stopped job changes nothing), so a retry whose
        earlier try did stop the job answers False.
        """
        return self._stopped(submission_id, self.request("POST", _job_path(JOB_STOP_ENDPOINT, submission_id),
                                                         idempotent=True))

    async def a_stop_job(self, submission_id: str) -> bool:
        return self._stopped(submission_id, await self.a_request("POST", _job_path(JOB_STOP_ENDPOINT, submission_id),
                                                                 idempotent=True))

    def _logs_of(self, submission_id: str, response: requests.Response | httpx.Response) -> str:
        if response.status_code == 404:
            return ""
        if response.status_code >= 400:
            raise RayOperatorError(
                f"Ray did not return the log of job {submission_id} "
                f"(HTTP {response.status_code}: {_last_lines(response.text, lines=3)})"
            )
        return response.json().get("logs", "")

    def get_job_logs(self, submission_id: str) -> str:
        """The job's whole log so far ("" when no such job exists). To follow a job, tail it instead."""
        return self._logs_of(submission_id, self.request("GET", _job_path(JOB_LOGS_ENDPOINT, submission_id)))

    async def a_get_job_logs(self, submission_id: str) -> str:
        return self._logs_of(submission_id, await self.a_request("GET", _job_path(JOB_LOGS_ENDPOINT, submission_id)))

    async def a_tail_job_logs(self, submission_id: str, *, offset: int = 0,
                              status_poll_s: float = STATUS_POLL_S) -> AsyncIterator[str]:
        """The job's log lines as the job writes them, each with its line end.

        Ends once the job has ended and its log is read to the end (a last line without a line
        end comes then). Ray's tail websocket always starts at the log's beginning; the first
        ``offset`` characters are skipped, so a caller whose stream dropped reconnects with the
        number of characters it already has. Characters count as in :meth:`get_job_logs`'s text.

        Ray's stream closes seconds after the job has ended (it looks at the job between
        one-second sleeps, after a one-second sleep at the log's end), which every stage task
        would wait out. So the job's state is read as well, at most every ``status_poll_s``
        seconds; once the job has ended, the rest of its log comes from :meth:`a_get_job_logs`
        and the stream is closed.

        Raises :class:`RayClusterUnreachableError` when the stream cannot be opened or drops.
        """
        stream = self._a_log_stream(submission_id, offset=offset)
        sent, looked = offset, time.monotonic()
        pending: asyncio.Future | None = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(anext(stream))
                done, _ = await asyncio.wait({pending}, timeout=max(looked + status_poll_s - time.monotonic(), 0))
                if done:
                    line, pending = pending, None
                    try:
                        text = line.result()
                    except StopAsyncIteration:
                        return
                    sent += len(text)
                    yield text
                    if time.monotonic() < looked + status_poll_s:
                        continue
                # One try each, as the stream has: a cluster that cannot be reached is the caller's
                # to wait out (RayJobTrigger's max_unreachable_s), not the connection's retries'.
                looked = time.monotonic()
                info = self._job_info_of(submission_id, await self.a_request(
                    "GET", _job_path(JOB_ENDPOINT, submission_id), idempotent=False))
                if info is not None and RayJobStatus(info["status"]).is_terminal():
                    rest = self._logs_of(submission_id, await self.a_request(
                        "GET", _job_path(JOB_LOGS_ENDPOINT, submission_id), idempotent=False))[sent:]
                    for text in rest.splitlines(keepends=True):
                        yield text
                    return
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await stream.aclose()

    async def _a_log_stream(self, submission_id: str, *, offset: int) -> AsyncIterator[str]:
        """Ray's tail websocket of the job's log, from ``offset`` characters on, until Ray closes it."""
        import aiohttp  # Ray's own client (ray[default]) brings it; only the tail needs it

        await self._a_load_settings()
        path = _job_path(JOB_LOGS_TAIL_ENDPOINT, submission_id)
        skip, partial = offset, ""
        try:
            async with aiohttp.ClientSession(
                headers=self.auth_headers(),
                # No total limit: the stream lives as long as the job; only connecting is bounded.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s),
            ) as session, session.ws_connect(
                f"{self.dashboard_url}{path}", ssl=_async_verify(self.verify_tls),
                heartbeat=LOG_STREAM_HEARTBEAT_S, timeout=_ws_close_timeout(aiohttp),
            ) as stream:
                async for message in stream:
                    if message.type is not aiohttp.WSMsgType.TEXT:
                        continue
                    text = message.data
                    if skip:
                        dropped = min(skip, len(text))
                        text, skip = text[dropped:], skip - dropped
                    text = partial + text
                    complete = text.rfind("\n") + 1
                    partial = text[complete:]
                    for line in text[:complete].splitlines(keepends=True):
                        yield line
                close_code, close_error = stream.close_code, stream.exception()
        except aiohttp.WSServerHandshakeError as err:
            self._raise_for_auth(err.status, err.message)
            if err.status == 404:
                raise RayOperatorError(f"Ray job {submission_id} does not exist at {self.dashboard_url}") from None
            # a proxy's or a restarting dashboard's answer: the caller reconnects, as after a dropped stream
            error = RayClusterUnreachableError if err.status in TRANSIENT_STATUSES else RayOperatorError
            raise error(
                f"GET {self.dashboard_url}{path} (websocket) answered HTTP {err.status}: {err.message}"
            ) from None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as err:
            raise RayClusterUnreachableError(self.unreachable_message(type(err).__name__)) from None
        # Ray closes the stream normally once the job has ended and its log is sent.
        if close_code != aiohttp.WSCloseCode.OK:
            raise RayClusterUnreachableError(
                f"the log stream of Ray job {submission_id} from {self.dashboard_url} dropped before the "
                f"job ended (websocket close code {close_code}, {close_error!r})"
            )
        if partial:
            yield partial

    def tail_job_logs(self, submission_id: str, *, offset: int = 0, timeout_s: float | None = None,
                      status_poll_s: float = STATUS_POLL_S) -> Iterator[str]:
        """Sync twin of :meth:`a_tail_job_logs`, for a worker following its job.

        The stream is read by an event loop in a thread of its own, and this generator waits on
        what it hands over. A signal's exception (Airflow's ``execution_timeout``, its SIGTERM)
        therefore always lands in the caller's code: raised inside an event-loop callback, asyncio
        would log it and carry on, and the task would follow its job to the end.

        Raises ``TimeoutError`` when the stream has not ended after ``timeout_s`` seconds.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._settings  # the connection is read here, in the task's thread, never in the reader's
        received: queue.SimpleQueue = queue.SimpleQueue()
        loop = asyncio.new_event_loop()
        pump = loop.create_task(self._pump_log_lines(submission_id, offset, status_poll_s, received))
        reader = threading.Thread(target=_run_until_complete, args=(loop, pump), daemon=True,
                                  name=f"ray-log-tail-{submission_id}")
        reader.start()
        try:
            while True:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:
                    line, error = received.get(timeout=remaining)
                except queue.Empty:
                    raise TimeoutError(f"the log of Ray job {submission_id} did not end within {timeout_s} s") from None
                if line is _LOG_END:
                    if error is not None:
                        raise error
                    return
                yield line
        finally:
            # The reader leaves (an interrupt, a timeout, or the end): the stream closes in its own loop.
            with contextlib.suppress(RuntimeError):  # that loop has already closed
                loop.call_soon_threadsafe(pump.cancel)
            reader.join(timeout=LOG_READER_JOIN_S)

    async def _pump_log_lines(self, submission_id: str, offset: int, status_poll_s: float,
                              received: queue.SimpleQueue) -> None:
        """Put each line of the tail on ``received``, then ``(_LOG_END, error or None)``."""
        try:
            async for line in self.a_tail_job_logs(submission_id, offset=offset, status_poll_s=status_poll_s):
                received.put((line, None))
        except asyncio.CancelledError:
            return  # the reader has left
        except Exception as err:
            received.put((_LOG_END, err))
        else:
            received.put((_LOG_END, None))

    # -- Serve --------------------------------------------------------------------------------

    def get_serve_applications(self) -> dict[str, Any]:
        """The Serve REST API's view of the deployed applications (empty when Serve is not running)."""
        return self.get_json(SERVE_APPLICATIONS_ENDPOINT)

    async def a_get_serve_applications(self) -> dict[str, Any]:
        return await self.a_get_json(SERVE_APPLICATIONS_ENDPOINT)

    def _check_serve_put(self, response: requests.Response | httpx.Response) -> None:
        if response.status_code >= 400:
            raise RayOperatorError(
                f"Ray Serve rejected the config (HTTP {response.status_code}): {_last_lines(response.text)}"
            )

    def put_serve_applications(self, config: dict[str, Any]) -> None:
        """Apply a declarative Serve config (all applications) through the REST API.

        Retried like any PUT: the whole config is declared each time, so applying it twice is applying it once.
        """
        self._check_serve_put(self.request("PUT", SERVE_APPLICATIONS_ENDPOINT, json=config))

    async def a_put_serve_applications(self, config: dict[str, Any]) -> None:
        self._check_serve_put(await self.a_request("PUT", SERVE_APPLICATIONS_ENDPOINT, json=config))

    # -- a Serve application's endpoint -------------------------------------------------------

    def endpoint_url(self, route_prefix: str) -> str:
        """Where the application at ``route_prefix`` answers: the connection's ``serve_url`` and the prefix."""
        return f"{self.serve_url}{route_prefix}"

    def endpoint_request(self, method: str, path: str, *, api_key: str | None = None, **kwargs: Any) -> requests.Response:
        """Send a request to a Serve endpoint (``path`` under ``serve_url``), with the application's
        API key when it has one; every answer is the caller's to read.

        No answer raises :class:`ServeUnreachableError`; an endpoint whose HTTP proxy is still
        starting gives that too.
        """
        url = f"{self.serve_url}{path}"
        headers = {**({"X-API-Key": api_key} if api_key else {}), **kwargs.pop("headers", {})}

        def unreachable(detail: str) -> ServeUnreachableError:
            return ServeUnreachableError(
                f"Cannot reach the Serve endpoint {url} ({detail}): is Ray Serve running, and is its HTTP address "
                f"the serve_url of the connection {self.ray_conn_id!r} (now {self.serve_url})?")

        return self.send(method, url, headers=headers, unreachable=unreachable, **kwargs)

    def get_endpoint_health(self, route_prefix: str, *, api_key: str | None = None) -> requests.Response:
        """The application's ``/health`` answer: 200 with ``model_version`` once a model is loaded."""
        return self.endpoint_request("GET", SERVE_HEALTH_ENDPOINT.format(route_prefix=route_prefix), api_key=api_key)

    def get_endpoint_metadata(self, route_prefix: str, *, api_key: str | None = None) -> dict[str, Any]:
        """The served model's card and input schema (``/metadata``); an answer other than 200 raises."""
        path = SERVE_METADATA_ENDPOINT.format(route_prefix=route_prefix)
        response = self.endpoint_request("GET", path, api_key=api_key)
        if response.status_code != 200:
            raise RayOperatorError(f"GET {self.serve_url}{path} answered HTTP {response.status_code}: "
                                   f"{response.text[:300]}")
        return response.json()

    def get_endpoint_rollout(self, route_prefix: str, *, api_key: str | None = None,
                             rows: bool = False) -> requests.Response:
        """The application's ``/rollout`` answer: 200 with what the challenger and the champion answered
        while a shadow or canary runs (``rows``: with the rows kept for a label file), 404 when none runs."""
        return self.endpoint_request("GET", SERVE_ROLLOUT_ENDPOINT.format(route_prefix=route_prefix),
                                     api_key=api_key, params={"rows": "1"} if rows else None)

    def post_endpoint_predict(self, route_prefix: str, instances: list[dict[str, Any]], *,
                              api_key: str | None = None) -> requests.Response:
        """The application's answer to ``{"instances": instances}`` on ``/predict``: 200 with the
        predictions, 422 naming the fields a row breaks, 503 while no model is loaded."""
        return self.endpoint_request("POST", SERVE_PREDICT_ENDPOINT.format(route_prefix=route_prefix),
                                     api_key=api_key, json={"instances": instances})


def cluster_autoscales(status: dict[str, Any]) -> bool:
    """Whether the cluster's autoscaler may add nodes, from :meth:`RayHook.get_cluster_status`'s answer.

    A cluster started with ``ray start`` and no autoscaling config runs a read-only monitor, whose
    report names each node's type ``node_<node id>`` and launches nothing: that cluster is static,
    its capacity is its nodes. An autoscaler with node types of its own, nodes pending or launching,
    or no report at all (an autoscaler that reports elsewhere, such as KubeRay's v2) may add nodes:
    its requests are not refused up front.
    """
    report = (status.get("clusterStatus") or {}).get("autoscalerReport")
    if not isinstance(report, dict):
        return True
    if report.get("pendingNodes") or report.get("pendingLaunches"):
        return True
    types = report.get("nodeTypeMapping") or {}
    return not types or any(str(name) != f"node_{node}" for node, name in types.items())


def _state_result(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a State API answer (``{"data": {"result": {"result": [...]}}}``)."""
    return payload.get("data", {}).get("result", {}).get("result", [])
