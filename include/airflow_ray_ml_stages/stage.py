"""The entry point shared by every stage: ``python -m airflow_ray_ml_stages.<stage> --spec '<json>'``.

It parses and validates the spec, runs the stage function, and writes the result manifest
atomically into the spec's artifact directory. On any error it writes a *failed* manifest with the
error message and exits non-zero, so the Airflow side can show the reason without reading a
traceback. The manifest is also printed on one marked log line, for clusters whose artifact root
the Airflow worker cannot read.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
import traceback
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import MANIFEST_LOG_MARKER, STATUS_FAILED, STATUS_SUCCEEDED
from airflow_ray_ml_stages.errors import RayMLError
from airflow_ray_ml_stages.spec_base import JsonDataclass
from airflow_ray_ml_stages.specs import StageSpec

log = logging.getLogger("airflow_ray_ml_stages")

RESERVED_KEYS = ("stage", "status", "artifact_dir", "started_at", "finished_at", "duration_s", "error", "retryable")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_manifest(
    stage: str, artifact_dir: str, started: float, result: JsonDataclass | None, error: str | None,
    retryable: bool = True,
) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "stage": stage,
        "status": STATUS_FAILED if error else STATUS_SUCCEEDED,
        "artifact_dir": artifact_dir,
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "finished_at": _now(),
        "duration_s": round(time.time() - started, 3),
    }
    if error:
        # whether another try could succeed: False for what the spec, data or artifacts must fix
        manifest.update(error=error, retryable=retryable)
    if result is not None:
        values = result.to_dict()
        clashes = sorted(set(values) & set(RESERVED_KEYS))
        if clashes:
            raise RuntimeError(f"{type(result).__name__} uses reserved manifest keys {clashes}")
        manifest.update(values)
    return manifest


def publish_manifest(manifest: dict[str, Any]) -> None:
    """Write the manifest into its artifact directory, if it names one, and repeat it on a marked log line."""
    try:
        if manifest["artifact_dir"]:
            artifacts.write_json_atomic(artifacts.manifest_uri(manifest["artifact_dir"]), manifest)
    finally:
        print(MANIFEST_LOG_MARKER + json.dumps(manifest, sort_keys=True), flush=True)


def _artifact_dir_of(raw_spec: str) -> str:
    """Best effort: the artifact directory named by a spec that failed validation."""
    try:
        value = json.loads(raw_spec).get("artifact_dir")
    except (json.JSONDecodeError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def run_stage(
    spec_type: type[StageSpec],
    run: Callable[[Any], JsonDataclass],
    argv: Sequence[str] | None = None,
) -> int:
    """Parse ``--spec``, run the stage and publish its manifest; return the exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    parser = argparse.ArgumentParser(prog=f"python -m airflow_ray_ml_stages.{spec_type.stage}")
    parser.add_argument("--spec", required=True, help="the stage spec as a JSON object")
    args = parser.parse_args(argv)
    started = time.time()
    artifact_dir = _artifact_dir_of(args.spec)
    try:
        spec = spec_type.from_json(args.spec)
        artifact_dir = spec.artifact_dir
        log.info("stage %s starting; artifacts in %s", spec_type.stage, artifact_dir)
        result = run(spec)
    except Exception as err:  # every failure must leave a failed manifest behind
        if isinstance(err, RayMLError):
            message = f"{type(err).__name__}: {err}"
            log.error("stage %s failed: %s", spec_type.stage, message)
        else:
            message = f"{type(err).__name__}: {err}"
            log.error("stage %s failed:\n%s", spec_type.stage, traceback.format_exc())
        # Errors of our own say whether a retry can help; anything else (a lost node, memory) may pass.
        retryable = err.retryable if isinstance(err, RayMLError) else True
        if artifact_dir:
            try:
                publish_manifest(build_manifest(spec_type.stage, artifact_dir, started, None, message, retryable))
            except Exception as write_err:  # the original error matters more
                log.error("could not write the failed manifest: %s", write_err)
        return 1
    publish_manifest(build_manifest(spec_type.stage, artifact_dir, started, result, None))
    log.info("stage %s succeeded in %.1f s", spec_type.stage, time.time() - started)
    return 0


def main_of(module_name: str) -> int:
    """Run ``module_name``'s ``main()`` from the importable module (``python -m`` runs a copy of it).

    Ray pickles the functions of an importable module by reference, but those of ``__main__`` by
    value, with every global they use (a lock, for one, does not pickle).
    """
    return importlib.import_module(module_name).main()
