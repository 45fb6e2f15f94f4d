"""What a Ray job of your own hands back to Airflow: ``report_result({...})``.

``RayJobOperator(entrypoint=...)`` runs any command as a Ray job and names this task run's artifact
directory in the job's ``RAYML_ARTIFACT_DIR`` environment variable. A script that calls
:func:`report_result` writes its result there as the run's ``manifest.json`` (and repeats it on one
marked log line, for an Airflow worker that cannot read the artifact root); the operator returns it
as the task's XCom. A script that does not can print one JSON line last instead. The package
travels with every job the operator submits (``ship_package``), so a script can import this module
without installing anything::

    from airflow_ray_ml_stages.job_result import report_result

    report_result({"rows": 1200, "output_uri": "s3://bucket/out.parquet"})
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from airflow_ray_ml_stages.constants import ARTIFACT_DIR_ENV, STATUS_SUCCEEDED
from airflow_ray_ml_stages.stage import publish_manifest

RESERVED = ("status", "artifact_dir", "finished_at")


def report_result(result: dict[str, Any]) -> dict[str, Any]:
    """Publish ``result`` (a JSON-able dict) as this job's manifest; return the manifest.

    Outside a job of RayJobOperator's (no ``RAYML_ARTIFACT_DIR``) it is only printed, on the same
    marked line, so a script runs the same way by hand.
    """
    if not isinstance(result, dict):
        raise TypeError(f"report_result takes a dict of results, got {type(result).__name__}")
    clashes = sorted(set(result) & set(RESERVED))
    if clashes:
        raise ValueError(f"report_result: the keys {clashes} are the manifest's own; rename them")
    manifest = {**result, "status": STATUS_SUCCEEDED, "artifact_dir": os.environ.get(ARTIFACT_DIR_ENV, ""),
                "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        json.dumps(manifest)
    except (TypeError, ValueError) as err:
        raise TypeError(f"report_result: the result must be JSON-able (numbers, text, lists, dicts): {err}") from None
    publish_manifest(manifest)  # outside RayJobOperator's job (no artifact dir): only the log line
    return manifest
