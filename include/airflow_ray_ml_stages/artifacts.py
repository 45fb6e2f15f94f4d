"""Artifact storage on ``pyarrow.fs``: local paths, ``file://``, ``s3://`` and ``gs://`` alike.

Layout (docs/design.md): ``<root>/<dag_id>/<run_id>/<task_id>[.<map_index>]/`` holds one task run's
outputs and its ``manifest.json``. Run ids are kept readable but made safe as path segments.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any
from urllib.parse import urlsplit

from pyarrow import fs as pafs

from airflow_ray_ml_stages.constants import MANIFEST_NAME
from airflow_ray_ml_stages.errors import ArtifactError

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]+")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def safe_segment(value: str) -> str:
    """Turn an id (dag, run, task) into one path segment that every store accepts."""
    segment = _UNSAFE.sub("_", str(value)).strip("._")
    if not segment:
        raise ArtifactError(f"cannot build a path segment from {value!r}")
    return segment


def is_remote(uri: str) -> bool:
    return bool(_SCHEME.match(uri)) and not uri.startswith("file://")


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI or local path with ``/``."""
    base = uri.rstrip("/")
    for part in parts:
        base = f"{base}/{str(part).strip('/')}"
    return base


def run_dir(root: str, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """Return the artifact directory of one task run."""
    task = safe_segment(task_id) if map_index < 0 else f"{safe_segment(task_id)}.{map_index}"
    return join(root, safe_segment(dag_id), safe_segment(run_id), task)


_S3_STORES: dict[str, pafs.FileSystem] = {}
"""The S3 filesystems that ``use_s3_credentials`` set up in this process, by the URI prefix they serve."""


def use_s3_credentials(access_key: str | None = None, secret_key: str | None = None, *,
                       session_token: str | None = None, region: str | None = None,
                       endpoint_url: str | None = None, prefix: str = "s3://") -> None:
    """Read and write the ``s3://`` URIs under ``prefix`` in this process with these credentials and endpoint.

    Without this call, ``s3://`` URIs take pyarrow's default chain: ``AWS_*`` variables, the
    config files, the instance's or pod's role (how the Ray side reads them: the cluster's own
    identity). The Airflow side calls it with the storage connection of its ``ray_ml`` connection,
    for that connection's artifact root; a URI under several prefixes takes the longest one's, so
    two connections with roots in different buckets keep their own credentials in one process.

    :param endpoint_url: an S3-compatible server, such as ``http://127.0.0.1:8333``; None: AWS.
    :param prefix: the URIs these credentials are for: an artifact root, or every ``s3://`` URI.
    """
    if not prefix.startswith("s3://"):
        raise ArtifactError(f"S3 credentials are for s3:// URIs, not {prefix!r}")
    options: dict[str, Any] = {"access_key": access_key, "secret_key": secret_key,
                               "session_token": session_token, "region": region or "us-east-1"}
    if endpoint_url:
        parts = urlsplit(endpoint_url if "://" in endpoint_url else f"https://{endpoint_url}")
        if not parts.netloc:
            raise ArtifactError(f"the S3 endpoint {endpoint_url!r} names no host; give one like http://host:9000")
        options.update(endpoint_override=parts.netloc + parts.path.rstrip("/"), scheme=parts.scheme)
    try:
        filesystem = pafs.S3FileSystem(**{key: value for key, value in options.items() if value is not None})
    except (ValueError, TypeError) as err:  # e.g. a key without its secret
        raise ArtifactError(f"cannot use these S3 credentials: {err}") from None
    _S3_STORES[prefix.rstrip("/") if prefix != "s3://" else prefix] = filesystem


def forget_s3_credentials() -> None:
    """Drop every filesystem ``use_s3_credentials`` set up: ``s3://`` URIs take the default chain again."""
    _S3_STORES.clear()


def _s3_store(uri: str) -> pafs.FileSystem | None:
    """The filesystem set up for the longest prefix ``uri`` lies under (whole path segments), if any."""
    found = [prefix for prefix in _S3_STORES
             if prefix == "s3://" or uri == prefix or uri.startswith(prefix + "/")]
    return _S3_STORES[max(found, key=len)] if found else None


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return the filesystem and the path inside it for a URI or a local path."""
    if uri.startswith("file://"):
        return pafs.LocalFileSystem(), os.path.abspath(uri[len("file://") :])
    if not _SCHEME.match(uri):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
    store = _s3_store(uri) if uri.startswith("s3://") else None
    if store is not None:
        return store, uri[len("s3://") :].rstrip("/")
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as err:  # pyarrow raises several types for unsupported or unreachable stores
        raise ArtifactError(
            f"cannot open artifact store {uri!r}: {err}. Use a local path, file://, s3:// or gs://"
        ) from err


def ray_storage_path(uri: str) -> str:
    """A directory as Ray Train and Ray Tune take their ``storage_path``: a store's URI as it is, a
    local path absolute (Ray resolves store URIs with pyarrow itself, from the node's credentials)."""
    return uri if is_remote(uri) else resolve(uri)[1]


def makedirs(uri: str) -> None:
    filesystem, path = resolve(uri)
    filesystem.create_dir(path, recursive=True)


def list_files(uri: str) -> list[str]:
    """The names of the files directly in the directory ``uri``, sorted ([] where it does not exist)."""
    filesystem, path = resolve(uri)
    found = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(os.path.basename(info.path) for info in found if info.type == pafs.FileType.File)


def exists(uri: str) -> bool:
    filesystem, path = resolve(uri)
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound


def write_bytes_atomic(uri: str, data: bytes) -> None:
    """Write ``data`` so a reader sees either the old content or the new, never a torn file.

    Local files are written beside the target and renamed over it (atomic on POSIX). Object stores
    publish a single PUT atomically already, so they are written directly.
    """
    filesystem, path = resolve(uri)
    parent = path.rsplit("/", 1)[0]
    filesystem.create_dir(parent, recursive=True)
    if isinstance(filesystem, pafs.LocalFileSystem):
        temporary = f"{path}.tmp-{uuid.uuid4().hex}"
        with filesystem.open_output_stream(temporary) as stream:
            stream.write(data)
        os.replace(temporary, path)
        return
    with filesystem.open_output_stream(path) as stream:
        stream.write(data)


def write_json_atomic(uri: str, payload: Any) -> None:
    write_bytes_atomic(uri, json.dumps(payload, indent=2, sort_keys=True).encode("utf-8"))


def read_bytes(uri: str) -> bytes:
    filesystem, path = resolve(uri)
    try:
        with filesystem.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError as err:
        raise ArtifactError(f"artifact {uri!r} does not exist") from err


def read_json(uri: str) -> Any:
    data = read_bytes(uri)
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise ArtifactError(f"artifact {uri!r} is not valid JSON: {err}") from err


def manifest_uri(artifact_dir: str) -> str:
    return join(artifact_dir, MANIFEST_NAME)
