"""RayHook: an Airflow connection to a Ray cluster's dashboard (Jobs, Serve and State REST APIs)."""

from __future__ import annotations

import logging
import os
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from operators.errors import RayAuthError, RayClusterUnreachableError, RayOperatorError
from rayml.constants import DEFAULT_ARTIFACT_ROOT_ENV

try:
    from airflow.sdk import BaseHook
except ImportError:  # pragma: no cover - Airflow 2 layout, kept for readers on older images
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]

DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8265"
DEFAULT_TIMEOUT_S = 30.0
TOKEN_FILE = Path.home() / ".ray" / "auth_token"
HOW_TO_FIX = (
    "start a local cluster with `make run` (or `ray start --head --dashboard-host=127.0.0.1`), "
    "or point the Airflow connection '{conn_id}' at your cluster's dashboard URL"
)


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


def _as_bool(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() not in ("false", "0", "no", "off")


class RayHook(BaseHook):
    """Talk to a Ray cluster through its dashboard's REST APIs.

    The connection (type ``ray``) gives the dashboard URL (``dashboard_url`` field, or host and
    port), the auth token (``auth_token`` field or password; else ``RAY_AUTH_TOKEN``, else
    ``~/.ray/auth_token``), whether to verify TLS (on by default) and the artifact root. When the
    default connection ``ray_default`` is not defined, the hook uses ``RAY_DASHBOARD_URL`` or
    ``http://127.0.0.1:8265``, the embedded local cluster.

    :param ray_conn_id: the Airflow connection id.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str = default_conn_name, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.timeout_s = timeout_s

    @cached_property
    def _settings(self) -> dict[str, Any]:
        try:
            connection = self.get_connection(self.ray_conn_id)
        except Exception as err:
            if self.ray_conn_id != self.default_conn_name or "isn't defined" not in str(err):
                raise
            self.log.info("Connection %r is not defined; using the local Ray cluster", self.ray_conn_id)
            return {
                "dashboard_url": normalise_dashboard_url(
                    os.environ.get("RAY_DASHBOARD_URL", DEFAULT_DASHBOARD_URL)
                ),
                "token": None,
                "verify_tls": True,
                "artifact_root": None,
                "serve_url": None,
            }
        extra = connection.extra_dejson or {}
        url = extra.get("dashboard_url") or connection.host
        if not url:
            raise RayOperatorError(
                f"the Airflow connection {self.ray_conn_id!r} has no dashboard URL: set its "
                f"'dashboard_url' field (or host) to something like {DEFAULT_DASHBOARD_URL}"
            )
        return {
            "dashboard_url": normalise_dashboard_url(url, connection.port, connection.schema or "http"),
            "token": extra.get("auth_token") or connection.password,
            "verify_tls": _as_bool(extra.get("verify_tls"), True),
            "artifact_root": extra.get("artifact_root") or None,
            "serve_url": extra.get("serve_url") or None,
        }

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

    def get_token(self) -> str | None:
        return resolve_token(self._settings["token"])

    def auth_headers(self) -> dict[str, str]:
        token = self.get_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    # -- plain HTTP ---------------------------------------------------------------------------

    def unreachable_message(self, detail: object) -> str:
        return (
            f"Cannot reach the Ray cluster at {self.dashboard_url} ({detail}): "
            + HOW_TO_FIX.format(conn_id=self.ray_conn_id)
            + "."
        )

    def check_response(self, response: requests.Response) -> requests.Response:
        """Turn auth failures into :class:`RayAuthError` with the fix; leave other codes to callers."""
        if response.status_code in (401, 403):
            raise RayAuthError(
                f"The Ray cluster at {self.dashboard_url} rejected the request "
                f"(HTTP {response.status_code}: {response.text.strip()[:120]}): set the cluster's "
                f"auth token in the connection {self.ray_conn_id!r} (auth token field or password), "
                "in RAY_AUTH_TOKEN, or in ~/.ray/auth_token."
            )
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send an authenticated request to the dashboard; unreachable clusters raise one clear error."""
        kwargs.setdefault("timeout", self.timeout_s)
        headers = {**self.auth_headers(), **kwargs.pop("headers", {})}
        try:
            response = requests.request(
                method, f"{self.dashboard_url}{path}", headers=headers, verify=self.verify_tls, **kwargs
            )
        except requests.exceptions.RequestException as err:
            raise RayClusterUnreachableError(self.unreachable_message(type(err).__name__)) from None
        return self.check_response(response)

    def get_json(self, path: str, **kwargs: Any) -> Any:
        response = self.request("GET", path, **kwargs)
        if response.status_code >= 400:
            raise RayOperatorError(
                f"GET {self.dashboard_url}{path} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        return response.json()

    # -- clients ------------------------------------------------------------------------------

    def get_version(self) -> dict[str, Any]:
        return self.get_json("/api/version")

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

    def check_access(self) -> None:
        """Raise a clear error unless the cluster answers and accepts the token."""
        self.get_version()
        response = self.request("GET", "/api/jobs/")
        if response.status_code >= 400:
            raise RayOperatorError(
                f"The Ray Jobs API at {self.dashboard_url} answered HTTP {response.status_code}; "
                "is this a Ray dashboard with the job module enabled?"
            )

    def get_serve_applications(self) -> dict[str, Any]:
        """The Serve REST API's view of the deployed applications (empty when Serve is not running)."""
        return self.get_json("/api/serve/applications/")

    def put_serve_applications(self, config: dict[str, Any]) -> None:
        """Apply a declarative Serve config (all applications) through the REST API."""
        response = self.request("PUT", "/api/serve/applications/", json=config)
        if response.status_code >= 400:
            raise RayOperatorError(
                f"Ray Serve rejected the config (HTTP {response.status_code}): {_last_lines(response.text)}"
            )

    def get_cluster_resources(self) -> dict[str, Any]:
        """Per-node resources from the State API: ``{node_id: {"total": {...}, "state": ...}}``."""
        payload = self.get_json("/api/v0/nodes", params={"detail": "1", "limit": "1000"})
        nodes = payload.get("data", {}).get("result", {}).get("result", [])
        return {
            node["node_id"]: {
                "total": node.get("resources_total", {}),
                "state": node.get("state"),
                "address": node.get("node_ip"),
                "labels": node.get("labels", {}),
            }
            for node in nodes
        }

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button."""
        try:
            self.check_access()
            version = self.get_version()
        except RayOperatorError as err:
            return False, str(err)
        return True, f"Connected to Ray {version.get('ray_version', '?')} at {self.dashboard_url}"
