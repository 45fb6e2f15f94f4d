"""Where a Serve application's records live, and its serving history.

Under ``<artifact_root>/serving/<app>/``: ``history.json`` (every decision of a deploy or a
rollback, oldest first), ``configs/<version>.json`` (the whole Serve config each promotion applied,
what a rollback restores), ``runs/<version>.json`` (the DAG run that trained and promoted the
version, with its Params: what a drift-started retraining runs again), ``previous_config.json`` (what was live before the latest deploy) and
``code/`` (the Ray-side package, on object-store roots). The "Ray ML" page reads the same files.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_ray_ml_stages import artifacts

# The task XCom that holds a deploy's or a rollback's decision (action, versions, metrics, reason).
DECISION_XCOM_KEY = "decision"


def serving_dir(artifact_root: str | None, app_name: str) -> str:
    """Where an application's serving history, configs and previous config live."""
    if not artifact_root:
        from airflow_ray_ml.ray_job import DEFAULT_ARTIFACT_ROOT

        artifact_root = DEFAULT_ARTIFACT_ROOT
    return artifacts.join(artifact_root, "serving", artifacts.safe_segment(app_name))


def history_uri(app_serving_dir: str) -> str:
    """The application's serving history: a JSON list of decisions, oldest first."""
    return artifacts.join(app_serving_dir, "history.json")


def read_history(app_serving_dir: str) -> list[dict[str, Any]]:
    """The application's serving history (``[]`` before its first decision)."""
    uri = history_uri(app_serving_dir)
    return artifacts.read_json(uri) if artifacts.exists(uri) else []


def append_history(app_serving_dir: str, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the application's serving history, stamped with the time (UTC)."""
    history = read_history(app_serving_dir)
    history.append({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **entry})
    artifacts.write_json_atomic(history_uri(app_serving_dir), history)


def trial_uri(app_serving_dir: str) -> str:
    """The live trial in progress, as its deploy last saw it: ``{"mode", "share", "challenger_version",
    "champion_version", "started_at", "updated_at", "rows_wanted", "ends_by", "stats"}`` (the
    endpoint's ``/rollout`` answer without its rows). The page shows it while the application's
    config carries the trial of that challenger; the decision goes to the history."""
    return artifacts.join(app_serving_dir, "trial.json")


def config_uri(app_serving_dir: str, version: str) -> str:
    """The whole Serve config that a promotion of ``version`` applied (what a rollback restores)."""
    return artifacts.join(app_serving_dir, "configs", f"{version}.json")


def run_record_uri(app_serving_dir: str, version: str) -> str:
    """The DAG run that promoted ``version``: ``{"dag_id", "run_id", "params"}``, its Params as the run
    resolved them (defaults and conf), so a retraining can run with the same source, label and settings."""
    return artifacts.join(app_serving_dir, "runs", f"{version}.json")


def read_run_record(app_serving_dir: str, version: str) -> dict[str, Any] | None:
    """The run that promoted ``version``, or None (promoted before runs were kept, or by hand)."""
    uri = run_record_uri(app_serving_dir, version)
    return artifacts.read_json(uri) if artifacts.exists(uri) else None


def previous_config_uri(app_serving_dir: str) -> str:
    """What was live before the application's latest deploy (the config, its version and owner)."""
    return artifacts.join(app_serving_dir, "previous_config.json")
