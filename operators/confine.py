"""Confined sources: the files and URLs a run's conf may name, checked in Airflow before any job reads them.

A DAG's author is trusted; a person who fills a trigger form or a REST conf is not. A path or URL
that comes from Params reaches a Ray job that can read whatever its node can read (``/etc/passwd``,
a credentials file, an internal service, a cloud metadata address), and a data error then quotes
sample rows of it in the task log. So such a source must lie under an allowed root:

- **local paths** (and ``file://``) under a local root, after following symlinks and ``..`` on
  the Airflow worker, so no link or ``..`` escapes a root;
- **URLs** (``s3://``, ``gs://``, ``http(s)://``, ...) under a URL prefix: the same scheme, the
  same host (and port), and a path under the prefix's path, ``..`` and percent-escapes resolved.

The roots are the artifact root's ``data`` folder plus the ``allowed_sources`` field of the
``ray_ml`` connection (a list of path or URL prefixes). Nothing is read to decide, so a refused
source never reaches a log but by its name. Sources written into a DAG file by its author need no
check; :func:`confine_sources` is for the ones that come from Params.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from airflow_ray_ml.errors import SourceNotAllowedError
from airflow_ray_ml_stages import artifacts

SETTING = "allowed_sources"  # the ray connection's field that widens the roots
DATA_FOLDER = "data"  # <artifact root>/data: allowed by default
DEFAULT_PORTS = {"http": 80, "https": 443}
LEFT_BY_LINK = "it leads out of them once symlinks, '..' and %-escapes are resolved"


@dataclass(frozen=True)
class UrlPrefix:
    """A URL root: scheme, host (lower case), port and a path prefix (``/`` for the whole host)."""

    scheme: str
    host: str
    port: int | None
    path: str

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None and self.port != DEFAULT_PORTS.get(self.scheme) else ""
        return f"{self.scheme}://{self.host}{port}{self.path}"

    def holds(self, other: UrlPrefix) -> bool:
        return (self.scheme, self.host, self.port) == (other.scheme, other.host, other.port) and _under(
            other.path, self.path)


def _under(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it, compared by whole path segments (``/data/red`` does not hold ``/data/redacted``)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _scheme(source: str) -> str | None:
    return source.split("://", 1)[0] if artifacts.is_remote(source) or source.startswith("file://") else None


def _parse_url(source: str) -> UrlPrefix:
    """A URL as scheme, host, port and a normalised path: percent-escapes decoded, ``.`` and ``..`` resolved."""
    parts = urlsplit(source)
    scheme = parts.scheme.lower()
    try:
        port = parts.port if parts.port is not None else DEFAULT_PORTS.get(scheme)
    except ValueError:
        raise ValueError("its port is not a number") from None
    if not parts.hostname:
        raise ValueError("it has no host (or bucket)")
    path = posixpath.normpath("/" + unquote(parts.path).replace("\\", "/").lstrip("/"))
    return UrlPrefix(scheme, parts.hostname.lower(), port, path)


def shown(source: str) -> str:
    """A source as a message may quote it: a URL without its user, password, query or fragment."""
    scheme = _scheme(source)
    if scheme is None or scheme.lower() == "file":
        return source
    parts = urlsplit(source)
    host = parts.hostname or ""
    port = f":{parts.port}" if _port_or_none(parts) is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _port_or_none(parts) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


@dataclass(frozen=True)
class AllowedSources:
    """Where confined sources may lie: local roots (resolved) and URL prefixes.

    :param local: absolute local roots, symlinks resolved.
    :param urls: URL prefixes.
    :param where: the setting a message names as the one to change.
    """

    local: tuple[str, ...]
    urls: tuple[UrlPrefix, ...]
    where: str

    @classmethod
    def of(cls, roots: Iterable[str], where: str) -> AllowedSources:
        """Parse roots: absolute paths, ``file://`` paths, or URL prefixes with a host (``s3://bucket/prefix``)."""
        local: list[str] = []
        urls: list[UrlPrefix] = []
        for root in roots:
            root = str(root).strip()
            if not root:
                continue
            scheme = _scheme(root)
            if scheme in (None, "file"):
                path = root[len("file://"):] if scheme else root
                if not path.startswith("/"):
                    raise SourceNotAllowedError(f"{where}: the root {root!r} is not an absolute path; give absolute "
                                           "paths or URL prefixes such as s3://bucket/prefix")
                local.append(os.path.realpath(path))
                continue
            try:
                urls.append(_parse_url(root))
            except ValueError as err:
                raise SourceNotAllowedError(f"{where}: the root {shown(root)!r} is not a URL prefix ({err}); give "
                                       "absolute paths or URL prefixes such as https://host/path") from None
        return cls(tuple(dict.fromkeys(local)), tuple(dict.fromkeys(urls)), where)

    def __str__(self) -> str:
        return ", ".join([*self.local, *map(str, self.urls)]) or "none"

    def check(self, source: str) -> str:
        """Return ``source`` as given if it lies under a root; raise :class:`SourceNotAllowedError` otherwise."""
        if not isinstance(source, str) or not source.strip():
            raise SourceNotAllowedError(f"a source must be a path or URL, got {source!r:.80}")
        scheme = _scheme(source)
        if scheme is not None and scheme.lower() == "file" and scheme != "file":
            raise self._refused(source, "write its scheme as file://")
        if scheme in (None, "file"):
            path = source[len("file://"):] if scheme else source
            if not path.startswith("/"):
                raise self._refused(source, "give an absolute path")
            if any(_under(os.path.realpath(path), root) for root in self.local):
                return source
            raise self._refused(source, LEFT_BY_LINK if self._written_under(path) else "")
        try:
            url = _parse_url(source)
        except ValueError as err:
            raise self._refused(source, f"it is not a URL this can check: {err}") from None
        if any(prefix.holds(url) for prefix in self.urls):
            return source
        raise self._refused(source, LEFT_BY_LINK if self._written_under(shown(source)) else "")

    def _written_under(self, written: str) -> bool:
        """The source as written starts with a root: a link, '..' or an escape took it out."""
        return any(written.startswith(root.rstrip("/") + "/") for root in [*self.local, *map(str, self.urls)])

    def _refused(self, source: str, reason: str) -> SourceNotAllowedError:
        return SourceNotAllowedError(
            f"the source {shown(source)!r} is not under the allowed sources [{self}]"
            + (f": {reason}" if reason else "")
            + f". Put the file under one of them, or widen them: {self.where}"
        )


def parse_setting(value: object) -> list[str]:
    """The ``allowed_sources`` field as a list: a JSON list, or text with one root per line or comma."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise SourceNotAllowedError(f"{SETTING} must be a list of paths or URL prefixes, got the text "
                                       f"{text[:200]!r}") from None
        else:
            return [item.strip() for line in text.splitlines() for item in line.split(",") if item.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return list(value)
    raise SourceNotAllowedError(f"{SETTING} must be a list of paths or URL prefixes, got {value!r:.200}")


def default_root(artifact_root: str) -> str:
    """The root allowed without any setting: the artifact root's ``data`` folder."""
    return artifacts.join(artifact_root, DATA_FOLDER)


def allowed_sources(ray_conn_id: str | None = None, artifact_root: str | None = None) -> AllowedSources:
    """The roots of connection ``ray_conn_id``: its artifact root's ``data`` folder and its ``allowed_sources``.

    :param ray_conn_id: the ``ray_ml`` connection; default ``ray_default``.
    :param artifact_root: the artifact root whose ``data`` folder is allowed; default: the connection's
        (as the operators choose it).
    """
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.ray_job import DEFAULT_ARTIFACT_ROOT

    hook = RayHook(ray_conn_id or RayHook.default_conn_name)
    root = artifact_root or hook.artifact_root or DEFAULT_ARTIFACT_ROOT
    where = (f"add a path or URL prefix to the '{SETTING}' field of the Airflow connection {hook.ray_conn_id!r} "
             "(docs/deployment.md#confined-sources)")
    return AllowedSources.of([default_root(root), *parse_setting(hook.allowed_sources)], where)


def confine_sources(sources: str | Iterable[str], *, ray_conn_id: str | None = None,
                    artifact_root: str | None = None) -> list[str]:
    """Return ``sources`` (one or a list) as given if each lies under the allowed roots; else fail the task.

    Call it where a path or URL from Params or a run's conf enters a DAG, before any task reads it::

        @task
        def files(params=None):
            return confine_sources(params["source"])

    Raises :class:`~airflow_ray_ml.errors.SourceNotAllowedError` (no retries) naming the setting to
    change; nothing is read to decide.

    :param sources: a path or URL, or a list of them.
    :param ray_conn_id: the ``ray_ml`` connection whose ``allowed_sources`` widen the roots; default ``ray_default``.
    :param artifact_root: the artifact root whose ``data`` folder is allowed; default: the connection's.
    """
    items = [sources] if isinstance(sources, str) else list(sources)
    allowed = allowed_sources(ray_conn_id, artifact_root)
    return [allowed.check(source) for source in items]
