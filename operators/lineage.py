"""What each task read and wrote, as OpenLineage datasets for Airflow's OpenLineage integration.

Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``) calls an operator's
``get_openlineage_facets_on_complete(task_instance)`` when a task ends, and sends the datasets it
returns with the task's COMPLETE (or FAIL) event. The stage operators answer from the spec their
job ran with (what it read) and the manifest it returned (what it wrote), through
:func:`stage_lineage`; the deploy operator answers with the model directory and the endpoint.

Names follow the OpenLineage naming spec (:func:`dataset_name`), so a dataset one task writes and
the next one reads is the same node in a lineage backend. The provider is imported only when it
calls, so everything else works where it is not installed. See docs/lineage.md.
"""

from __future__ import annotations

import os
from typing import Any, Iterable
from urllib.parse import urlsplit

# stage -> (the spec fields it reads, the manifest keys it writes). A field or key holds a URI, a
# list of URIs or a dict whose values are URIs. An input the stage's manifest also records (what
# the score stage read) is taken from there.
STAGE_DATASETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "generate": ((), ("data_uris",)),
    "probe": ((), ()),
    "data": (("source",), ("split_uris", "preprocessor_uri", "preprocessor_variants")),
    "tune": (("train_uri", "validation_uri", "preprocessor_uri"),
             ("best_checkpoint_uri", "leaderboard_json_uri", "leaderboard_csv_uri", "plot_uri")),
    "train": (("train_uri", "validation_uri", "test_uri", "preprocessor_uri"), ("model_dir",)),
    "score": (("input_uri", "model_dir"), ("output_uri",)),
}
# object stores: namespace <scheme>://<bucket>, name the object key
BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfss", "wasbs", "hdfs")


def dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``uri`` by the OpenLineage naming spec.

    A local path or ``file:///path``: ``file`` and the absolute path; ``file://host/path``:
    ``file://host`` and the path; ``s3://bucket/key`` (and ``gs://``, ...): ``s3://bucket`` and the
    key; any other URL, such as an HTTP source file or a Serve endpoint: ``scheme://host:port`` and
    the path. A trailing ``/`` (a directory) is not part of the name.
    """
    parts = urlsplit(uri)
    if not parts.scheme or len(parts.scheme) == 1:  # a path (a one-letter scheme is a drive)
        return "file", os.path.abspath(os.path.expanduser(uri))
    if parts.scheme == "file":
        path = os.path.normpath(parts.path) if parts.path else "/"
        return ("file", path) if parts.netloc in ("", "localhost") else (f"file://{parts.netloc}", path)
    if parts.scheme in BUCKET_SCHEMES:
        return f"{parts.scheme}://{parts.netloc}", parts.path.strip("/")
    path = parts.path.rstrip("/") or "/"
    return f"{parts.scheme}://{parts.netloc}", path


def _uris(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [uri for item in value for uri in _uris(item)]
    return []


def stage_datasets(stage: str, spec: dict[str, Any] | None,
                   manifest: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """The URIs a stage's job read (from its spec) and wrote (from its manifest; none without one)."""
    reads, writes = STAGE_DATASETS.get(stage, ((), ()))
    spec, manifest = spec or {}, manifest or {}
    inputs = [uri for field in reads for uri in _uris(manifest[field] if field in manifest else spec.get(field))]
    outputs = [uri for key in writes for uri in _uris(manifest.get(key))]
    return inputs, outputs


def operator_lineage(inputs: Iterable[str | None], outputs: Iterable[str | None]) -> Any:
    """An ``OperatorLineage`` of ``inputs`` and ``outputs`` (URIs; empty ones left out), each dataset once."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    def datasets(uris: Iterable[str | None]) -> list[Dataset]:
        names = dict.fromkeys(dataset_name(uri) for uri in _uris(list(uris)))
        return [Dataset(namespace=namespace, name=name) for namespace, name in names]

    return OperatorLineage(inputs=datasets(inputs), outputs=datasets(outputs))


def stage_lineage(stage: str, spec: dict[str, Any] | None, manifest: dict[str, Any] | None) -> Any:
    """The ``OperatorLineage`` of one stage's task run."""
    return operator_lineage(*stage_datasets(stage, spec, manifest))
