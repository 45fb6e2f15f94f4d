"""The stage operators and the cluster's resources: tune sizes its trials to the cluster (side by side
where CPUs are free, in fractions where Serve applications hold most of them), and a search or a
worker group that cannot start fails in bounded time naming what holds the CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import structlog

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.tune import most_at_once
from tests.conftest import extra_cluster, load_dag
from tests.operators.test_ray_job import _xcom
from tests.train_data import as_preprocess_xcom, write_preprocessed, write_splits

LOGICAL_DATE = datetime(2026, 7, 1, tzinfo=timezone.utc)
# Small XGBoost trials that each run to their end (no scheduler): a few seconds each.
XGBOOST_SPACE = {"family": "xgboost", "scaler": "standard",
                 "xgboost": {"max_depth": {"randint": [2, 6]}, "eta": {"uniform": [0.1, 0.3]}, "num_boost_round": 60}}
# A Serve deployment that only holds CPUs: three of them stand in for served models.
HOLD_APPS = """
import sys
from ray import serve

@serve.deployment(ray_actor_options={"num_cpus": float(sys.argv[1])})
class Hold:
    def __call__(self, request):
        return "held"

serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
for name in sys.argv[3:]:
    if float(sys.argv[1]):
        serve.run(Hold.bind(), name=name, route_prefix=f"/{name}")
    else:
        serve.delete(name)
"""


@pytest.fixture(scope="module")
def preprocess(tmp_path_factory) -> dict:
    return write_preprocessed(tmp_path_factory.mktemp("tune-resources-data"), rows=3000, seed=11)


def _run(preprocess: dict, day: int, dag_id: str = "tune_sized", **conf):
    when = LOGICAL_DATE.replace(day=day)
    return load_dag(dag_id).test(logical_date=when, run_after=when,
                                       run_conf={"preprocess": preprocess, "search_space": XGBOOST_SPACE, **conf})


def _hold_cpus(cluster, cpus_each: float, names: list[str]) -> None:
    """Deploy Serve applications ``names`` on ``cluster``, each holding ``cpus_each`` CPU (0: delete them)."""
    from scripts.localcluster import free_port

    env = {**cluster.env(), "RAY_ADDRESS": cluster.address, "RAY_AUTH_TOKEN": cluster.token}
    subprocess.run([sys.executable, "-c", HOLD_APPS, str(cpus_each), str(free_port()), *names],
                   env=env, check=True, timeout=300, stdout=subprocess.DEVNULL)


@pytest.mark.integration
def test_tune_on_eight_cpus_runs_at_least_three_trials_at_once(airflow_db, preprocess):
    with extra_cluster("ray_eight", num_cpus=8):
        dag_run = _run(preprocess, day=1, dag_id="tune_eight_cpus")
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    assert manifest["trials"]["total"] == 6 and manifest["trials"]["failed"] == 0
    rows = json.loads(Path(manifest["leaderboard_json_uri"]).read_text())
    spans = [(row["started_at"], row["ended_at"]) for row in rows]
    assert all(start is not None and end is not None and end > start for start, end in spans), spans
    assert most_at_once(spans) >= 3, spans
    assert manifest["most_trials_at_once"] == most_at_once(spans)
    # one CPU each on an idle 8-CPU cluster, two kept for Ray Data
    assert manifest["resources_per_trial"]["cpu"] == 1 and manifest["resources_per_trial"]["threads"] == 1
    assert "6 at once" in manifest["trial_sizing"], manifest["trial_sizing"]


@pytest.fixture(scope="module")
def busy_cluster(airflow_db):
    """A 2-CPU cluster on which three Serve applications hold 1.8 CPU."""
    with extra_cluster("ray_sized", num_cpus=2) as cluster:
        _hold_cpus(cluster, 0.6, ["app-a", "app-b", "app-c"])
        yield cluster


@pytest.mark.integration
def test_tune_beside_serve_apps_holding_cpus_sizes_trials_to_what_is_free(busy_cluster, preprocess):
    dag_run = _run(preprocess, day=2)
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "tune")
    assert manifest["trials"]["completed"] == 8
    assert 0 < manifest["resources_per_trial"]["cpu"] <= 0.2, manifest["resources_per_trial"]
    assert "small or busy cluster" in manifest["trial_sizing"]


@pytest.mark.integration
def test_tune_whose_trials_cannot_start_beside_serve_apps_fails_in_bounded_time_naming_them(
        busy_cluster, preprocess):
    started = time.monotonic()
    with structlog.testing.capture_logs(processors=[structlog.processors.format_exc_info]) as records:
        dag_run = _run(preprocess, day=3, cpus_per_trial=1, resource_wait_s=5)
    elapsed = time.monotonic() - started
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.try_number == 1  # at once: it had a retry it did not use
    assert elapsed < 150, elapsed  # 5 s of waiting, the job's start and the task's, never the 900 s budget
    error = _failure(records)
    assert "ResourcesUnavailableError: no trial could start within resource_wait_s=5 s" in error, error
    assert "1.8 CPU held by Serve apps app-a, app-b, app-c (1.8)" in error, error
    assert "0.2 of 2 CPU free; each trial needs 1 CPU" in error, error
    assert "cpus_per_trial" in error and "RAY_CPUS" in error
    # while it waited, the reason was where the Ray ML page looks for it
    root = json.loads(os.environ["AIRFLOW_CONN_RAY_SIZED"])["extra"]["artifact_root"]
    waiting = Path(artifacts.run_dir(root, "tune_sized", dag_run.run_id, "tune"), "waiting.json")
    assert json.loads(waiting.read_text())["state"] == "pending"


def _failure(records) -> str:
    (failure,) = [record for record in records if record["event"] == "Task failed with exception"]
    return failure["exception"].strip().splitlines()[-1]


@pytest.mark.integration
def test_train_workers_that_cannot_start_beside_serve_apps_fail_in_bounded_time_naming_them(
        busy_cluster, tmp_path):
    splits = write_splits(tmp_path / "splits", rows=1000, seed=3)
    when = LOGICAL_DATE.replace(day=4)
    _hold_cpus(busy_cluster, 0.2, ["app-d"])  # the last 0.2 CPU: not even a share of one is free
    try:
        started = time.monotonic()
        with structlog.testing.capture_logs(processors=[structlog.processors.format_exc_info]) as records:
            dag_run = load_dag("train_held").test(logical_date=when, run_after=when, run_conf={
                "data": as_preprocess_xcom(splits), "config": {"family": "xgboost", "num_boost_round": 5}})
        elapsed = time.monotonic() - started
    finally:
        _hold_cpus(busy_cluster, 0, ["app-d"])
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.try_number == 1
    assert elapsed < 120, elapsed  # 5 s of waiting and the job's start, not Ray Train's endless retries
    error = _failure(records)
    assert "1 Ray Train worker(s) could not start within resource_wait_s=5 s" in error, error
    assert "2 CPU held by Serve apps app-a, app-b, app-c, app-d (2); 0 of 2 CPU free; each worker needs" in error
