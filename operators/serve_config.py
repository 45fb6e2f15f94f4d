"""Serve's declarative config, merged so that a deploy changes only its own application.

Serve takes one config document for the whole instance (``RayHook.put_serve_applications``): the
instance-wide settings and every application. A deploy or a rollback reads what is live, sends the
other applications and the instance's settings back as they are, and puts its own application in
(:func:`config_with_app`). Serve's code reaches the replicas as the ``airflow_ray_ml_stages``
package installed on the cluster, or, on an object-store artifact root, as a zip that
:func:`upload_code` writes there for the application's ``runtime_env``.
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

from airflow_ray_ml_stages import artifacts

# The instance-wide settings of Serve's declarative config: every top-level key but "applications".
SERVE_INSTANCE_SETTINGS = ("proxy_location", "http_options", "grpc_options", "controller_options",
                           "logging_config", "tracing_config", "target_capacity")
# Serve takes these only when it starts; a running instance keeps its own whatever a config says.
START_ONLY_SETTINGS = frozenset({"proxy_location", "http_options", "grpc_options", "controller_options"})
# What a deploy starts Serve with when it is not running; the HTTP port is the connection's serve_url's.
SERVE_START_DEFAULTS: dict[str, Any] = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1"}}


def start_settings(serve_url: str) -> dict[str, Any]:
    """``SERVE_START_DEFAULTS`` with HTTP on the port of ``serve_url`` (the connection's), 8000 when it names none."""
    port = urlsplit(serve_url).port or 8000
    return {**SERVE_START_DEFAULTS, "http_options": {**SERVE_START_DEFAULTS["http_options"], "port": port}}


def live_instance_settings(state: dict[str, Any]) -> dict[str, Any] | None:
    """The running Serve instance's settings, as the REST API reports them; None when Serve is not running."""
    if not state.get("proxy_location"):
        return None
    return {key: state[key] for key in SERVE_INSTANCE_SETTINGS if state.get(key) is not None}


def live_applications(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The declarative config of every application that is live now."""
    return [app["deployed_app_config"] for app in (state.get("applications") or {}).values()
            if app.get("deployed_app_config")]


def instance_settings(live: dict[str, Any] | None, start_defaults: dict[str, Any],
                      requested: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The instance settings to deploy with, and the requested ones that a running Serve cannot take.

    A running instance keeps its settings; one that is not running starts with ``start_defaults``.
    ``requested`` settings go over either (a dict setting key by key), except the ones Serve takes
    only at start when it is already running.
    """
    settings = dict(live if live is not None else start_defaults)
    not_applied = []
    for key, value in (requested or {}).items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            value = {**settings[key], **value}
        if live is not None and key in START_ONLY_SETTINGS:
            if value != live.get(key):
                not_applied.append(key)
            continue
        settings[key] = value
    return settings, not_applied


def config_with_app(instance: dict[str, Any], applications: list[dict[str, Any]], app_name: str,
                    ours: dict[str, Any] | None) -> dict[str, Any]:
    """The whole config to PUT: ``instance`` settings, the applications other than ``app_name`` as
    given, and ``ours`` (None: ``app_name`` is removed)."""
    others = [app for app in applications if app.get("name") != app_name]
    return {**instance, "applications": [*others, *([ours] if ours else [])]}


def upload_code(app_serving_dir: str) -> str:
    """Zip the Ray-side package once per content version into ``<app_serving_dir>/code/``; return its URI."""
    import io
    import zipfile
    from pathlib import Path

    from airflow_ray_ml.ray_job import RAYML_PACKAGE_DIR

    package = Path(RAYML_PACKAGE_DIR)
    files = sorted(p for p in package.rglob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:16]
    uri = artifacts.join(app_serving_dir, "code", f"rayml-{digest}.zip")
    if not artifacts.exists(uri):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in files:
                archive.write(path, str(Path("airflow_ray_ml_stages") / path.relative_to(package)))
        artifacts.write_bytes_atomic(uri, buffer.getvalue())
    return uri
