"""Requests a cluster can never meet fail before any job is submitted, with the numbers; an autoscaling
cluster's are left to wait. Against a loopback server that answers like the dashboard, and a real cluster."""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest

from airflow_ray_ml.errors import RayResourcesError
from airflow_ray_ml.hooks.ray import CLUSTER_STATUS_ENDPOINT, JOBS_ENDPOINT, NODES_ENDPOINT, cluster_autoscales
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator

NODE_ID = "dc133f911f2450fa6fbaf7b9c9876dc7abe3fa7b02c6ba01bcc55c92"
# What `ray start --head` answers: its monitor is read-only and names the node's type after the node.
STATIC_STATUS = {"autoscalingStatus": "Cluster status: 0 nodes", "clusterStatus": {"autoscalerReport": {
    "activeNodes": {f"node_{NODE_ID}": 1}, "pendingNodes": [], "pendingLaunches": {},
    "nodeTypeMapping": {NODE_ID: f"node_{NODE_ID}"}, "legacy": True}}}
# An autoscaler with node types of its own (a cluster launcher's or KubeRay's worker groups).
AUTOSCALING_STATUS = {"autoscalingStatus": "...", "clusterStatus": {"autoscalerReport": {
    "activeNodes": {"head": 1}, "pendingNodes": [], "pendingLaunches": {},
    "nodeTypeMapping": {NODE_ID: "head"}}}}
TWO_CPU_NODE = {"node_id": NODE_ID, "state": "ALIVE", "resources_total": {"CPU": 2.0, "memory": 1e9}}
WORKER_SPEC = {"num_workers": 500, "compute": {"cpus_per_worker": 1.0}}


@contextmanager
def dashboard(cluster_status: dict):
    """A loopback server answering the dashboard routes the check reads; it records the requests."""
    seen: list[tuple[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, payload) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            path = self.path.split("?")[0]
            seen.append(("GET", path))
            if path == NODES_ENDPOINT:
                self._answer({"data": {"result": {"result": [TWO_CPU_NODE]}}})
            elif path == CLUSTER_STATUS_ENDPOINT:
                self._answer({"result": True, "data": cluster_status})
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            seen.append(("POST", self.path))
            self.send_error(500)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def _connect(monkeypatch, url: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RAY_LOOPBACK", json.dumps({"conn_type": "ray_ml", "extra": {"dashboard_url": url}}))


def _train(**kwargs) -> RayTrainOperator:
    from airflow.sdk import DAG

    with DAG(dag_id="resources_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        return RayTrainOperator(task_id="train", data={}, ray_conn_id="ray_loopback", **kwargs)


def test_cluster_autoscales_reads_a_read_only_monitor_as_static_and_the_rest_as_autoscaling():
    assert cluster_autoscales(STATIC_STATUS) is False
    assert cluster_autoscales(AUTOSCALING_STATUS) is True
    launching = json.loads(json.dumps(STATIC_STATUS))
    launching["clusterStatus"]["autoscalerReport"]["pendingLaunches"] = {"cpu-group": 2}
    assert cluster_autoscales(launching) is True
    assert cluster_autoscales({}) is True  # no report here (an autoscaler reporting elsewhere): not refused


def test_train_workers_far_above_a_static_cluster_fail_before_any_job_naming_the_numbers(monkeypatch):
    with dashboard(STATIC_STATUS) as (url, seen):
        _connect(monkeypatch, url)
        with pytest.raises(RayResourcesError) as raised:
            _train().check_resources(WORKER_SPEC)
    assert "500 training worker(s) x 1 CPU = 500 CPU, but the cluster has 2 CPU in all" in str(raised.value)
    assert "Lower num_workers (the train_workers Param)" in str(raised.value)
    assert not [request for request in seen if request[0] == "POST"]


def test_train_workers_above_an_autoscaling_cluster_pass_the_check_to_wait(monkeypatch):
    with dashboard(AUTOSCALING_STATUS) as (url, seen):
        _connect(monkeypatch, url)
        _train().check_resources(WORKER_SPEC)
    assert ("GET", CLUSTER_STATUS_ENDPOINT) in seen


def test_entrypoint_and_trial_requests_larger_than_any_node_fail_naming_their_setting(monkeypatch):
    from airflow.sdk import DAG

    with DAG(dag_id="resources_unit", schedule=None, start_date=datetime(2026, 1, 1)):
        job = RayJobOperator(task_id="job", entrypoint="python x.py", entrypoint_num_gpus=1,
                             ray_conn_id="ray_loopback")
        tune = RayTuneOperator(task_id="tune", data={}, ray_conn_id="ray_loopback")
    with dashboard(STATIC_STATUS) as (url, _):
        _connect(monkeypatch, url)
        with pytest.raises(RayResourcesError, match=r"each entrypoint needs 1 GPU, but no node has that.*"
                                                    r"Lower entrypoint_num_cpus / entrypoint_num_gpus"):
            job.check_resources(None)
        with pytest.raises(RayResourcesError, match=r"each trial needs 3 CPU.*the largest have 2 CPU"):
            tune.check_resources({"cpus_per_trial": 3})
        tune.check_resources({"cpus_per_trial": None})  # sized by the stage: nothing to refuse


def test_request_checks_without_a_request_ask_the_cluster_nothing(monkeypatch):
    with dashboard(STATIC_STATUS) as (url, seen):
        _connect(monkeypatch, url)
        _train().check_resources({"num_workers": None, "compute": {"cpus_per_worker": 1.0}})
    assert seen == []


@pytest.mark.integration
def test_train_workers_far_above_the_clusters_cpus_fail_in_seconds_and_leave_no_job(airflow_db, ray_conn):
    import structlog

    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.job_status import base_submission_id
    from tests.conftest import load_dag
    from tests.operators.test_ray_job import _jobs_of

    when = datetime(2026, 8, 1, tzinfo=timezone.utc)
    # a preprocess XCom whose files are never read: the request is refused before any job
    data = {"split_uris": {split: f"/nowhere/{split}" for split in ("train", "validation", "test")},
            "rows": {"train": 700, "validation": 150, "test": 150}, "feature_columns": ["a"], "label_column": "y",
            "preprocessor_uri": "/nowhere/preprocessor.json", "fingerprint": ""}
    started = time.monotonic()
    with structlog.testing.capture_logs(processors=[structlog.processors.format_exc_info]) as records:
        dag_run = load_dag("train_too_many_workers").test(
            logical_date=when, run_after=when, run_conf={"data": data, "config": {"family": "xgboost"}})
    elapsed = time.monotonic() - started
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.try_number == 1  # at once: it had retries it did not use
    assert elapsed < 60, elapsed
    (failure,) = [record for record in records if record["event"] == "Task failed with exception"]
    error = failure["exception"].strip().splitlines()[-1]
    assert "RayResourcesError" in error and "500 training worker(s) x 1 CPU = 500 CPU" in error, error
    assert "the cluster has 2 CPU in all" in error
    assert _jobs_of(RayHook(), base_submission_id("train_too_many_workers", dag_run.run_id, "train")) == []
