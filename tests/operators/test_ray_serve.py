"""RayServeDeployOperator and the Serve app, against a real local Ray cluster and real HTTP calls."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.ray_serve import APP_IMPORT_PATH, gate
from airflow_ray_ml_stages import artifacts
from tests.conftest import load_dag
from tests.operators.test_ray_job import _xcom

_RUNS = iter(range(1, 1000))


def _when() -> datetime:
    return datetime(2026, 6, 1, tzinfo=timezone.utc) + timedelta(hours=next(_RUNS))


def _deploy(dag_id: str, **conf):
    when = _when()
    dag_run = load_dag(dag_id).test(logical_date=when, run_after=when, run_conf=conf)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    return dag_run, states["deploy"]


def test_app_import_path_matches_the_ray_side():
    from airflow_ray_ml_stages import serve

    assert APP_IMPORT_PATH == serve.APP_IMPORT_PATH


@pytest.mark.parametrize(
    ("challenger", "champion", "metric", "min_improvement", "promote"),
    [
        (0.70, None, "rmse", 0.0, True),
        (0.70, 0.75, "rmse", 0.0, True),
        (0.70, 0.75, "rmse", 0.1, False),
        (0.75, 0.70, "rmse", 0.0, False),
        (0.70, 0.70, "rmse", 0.0, False),
        (0.60, 0.55, "acc_0_5", 0.01, True),
        (0.55, 0.60, "acc_0_5", 0.0, False),
    ],
)
def test_gate_promotes_only_a_better_challenger(challenger, champion, metric, min_improvement, promote):
    assert gate(challenger, champion, metric, min_improvement, force=False)[0] is promote
    assert gate(challenger, champion, metric, min_improvement, force=True)[0] is True


@pytest.fixture(scope="module")
def models(airflow_db, ray_conn):
    """Three trained models (worse < good < better on the same test split) and that split."""
    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    dag_run = load_dag("serve_models").test(logical_date=when, run_after=when)
    assert dag_run.state == "success"
    trained = {name: _xcom(dag_run, f"train_{name}") for name in ("worse", "good", "better")}
    rmse = {name: model["metrics"]["test"]["rmse"] for name, model in trained.items()}
    assert rmse["better"] < rmse["good"] < rmse["worse"], rmse  # the fixture's premise
    return trained, _xcom(dag_run, "preprocess")


def _endpoint(prefix: str = "/wine-test") -> str:
    return f"{RayHook().serve_url}{prefix}"


def _row() -> dict:
    return {"fixed acidity": 7.4, "volatile acidity": 0.7, "citric acid": 0.0, "residual sugar": 1.9,
            "chlorides": 0.076, "free sulfur dioxide": 11.0, "total sulfur dioxide": 34.0,
            "density": 0.9978, "pH": 3.51, "sulphates": 0.56, "alcohol": 9.4, "type": "red"}


def _served_version(prefix: str = "/wine-test", **headers) -> str:
    return requests.get(f"{_endpoint(prefix)}/health", headers=headers, timeout=10).json()["model_version"]


def _ensure_deployed(trained: dict, data: dict) -> None:
    """Deploy the good model unless the test application already answers (tests may run alone)."""
    try:
        if requests.get(f"{_endpoint()}/health", timeout=10).status_code == 200:
            return
    except requests.RequestException:
        pass
    assert _deploy("serve_deploy", model=trained["good"], data=data)[1] == "success"


def _history() -> list[dict]:
    return artifacts.read_json(artifacts.join(RayHook().artifact_root, "serving", "wine-test", "history.json"))


@pytest.mark.integration
def test_serve_flow_first_deploy_then_hot_swap_keep_and_rollback(models):
    trained, data = models

    # 1. Nothing served yet: the good model is promoted and answers a real prediction.
    dag_run, state = _deploy("serve_deploy", model=trained["good"], data=data)
    assert state == "success"
    assert _xcom(dag_run, "deploy")["action"] == "promoted"
    answer = requests.post(f"{_endpoint()}/predict", json={"instances": [_row(), _row()]}, timeout=10)
    assert answer.status_code == 200
    body = answer.json()
    assert body["model_version"] == trained["good"]["model_version"] and len(body["predictions"]) == 2
    assert 2 < body["predictions"][0] < 9

    # 2. A better model is swapped in while a bounded load loop keeps calling: no request fails.
    failures, versions, stop = [], set(), threading.Event()

    def load() -> None:
        deadline = time.monotonic() + 240
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                reply = requests.post(f"{_endpoint()}/predict", json={"instances": [_row()]}, timeout=10)
                if reply.status_code != 200:
                    failures.append(reply.status_code)
                else:
                    versions.add(reply.json()["model_version"])
            except requests.RequestException as err:
                failures.append(type(err).__name__)
            time.sleep(0.02)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        _, state = _deploy("serve_deploy", model=trained["better"], data=data)
        time.sleep(1)
    finally:
        stop.set()
        loader.join()
    assert state == "success"
    assert failures == []
    assert versions == {trained["good"]["model_version"], trained["better"]["model_version"]}
    assert _served_version() == trained["better"]["model_version"]

    # 3. A worse model is kept out: the task is skipped and the champion still answers.
    kept_run, state = _deploy("serve_deploy", model=trained["worse"], data=data)
    assert state == "skipped"
    decision = _xcom(kept_run, "deploy", key="decision")
    assert decision["action"] == "kept_champion"
    assert decision["champion_version"] == trained["better"]["model_version"]
    assert decision["challenger"] > decision["champion"]
    assert _served_version() == trained["better"]["model_version"]
    assert _history()[-1]["action"] == "kept_champion"

    # 4. A broken artifact (forced past the gate) is rolled back; the old version keeps answering.
    broken_dir = trained["good"]["model_dir"] + "-broken"
    shutil.copytree(trained["good"]["model_dir"], broken_dir)
    with open(os.path.join(broken_dir, "model.ubj"), "wb") as handle:
        handle.write(b"not a model")
    broken = {**trained["good"], "model_dir": broken_dir, "model_version": "broken-1",
              "metrics": {"test": {"rmse": 0.01}}}
    _, state = _deploy("serve_deploy", model=broken, data=data)
    assert state == "failed"
    assert _served_version() == trained["better"]["model_version"]
    assert _history()[-1]["action"] == "rolled_back"
    actions = [entry["action"] for entry in _history()]
    assert actions == ["promoted", "promoted", "kept_champion", "rolled_back"]
    previous = artifacts.read_json(artifacts.join(RayHook().artifact_root, "serving", "wine-test",
                                                  "previous_config.json"))
    assert previous["version"] == trained["better"]["model_version"]


@pytest.mark.integration
def test_serve_malformed_requests_get_4xx_with_field_messages(models):
    _ensure_deployed(*models)
    row = _row()
    cases = {
        "unknown feature": {"instances": [{**row, "colour": "red"}]},
        "missing feature": {"instances": [{k: v for k, v in row.items() if k != "alcohol"}]},
        "wrong type": {"instances": [{**row, "alcohol": "strong"}]},
        "boolean as number": {"instances": [{**row, "alcohol": True}]},
        "unknown category": {"instances": [{**row, "type": "rose"}]},
        "wrong row length": {"instances": [[1.0, 2.0]]},
        "empty batch": {"instances": []},
        "oversized batch": {"instances": [row] * 1025},
        "no instances key": {"rows": [row]},
    }
    for name, body in cases.items():
        reply = requests.post(f"{_endpoint()}/predict", json=body, timeout=30)
        assert 400 <= reply.status_code < 500, (name, reply.status_code, reply.text[:200])
        assert reply.json()["detail"], name
    not_json = requests.post(f"{_endpoint()}/predict", data="{", headers={"content-type": "application/json"},
                             timeout=10)
    assert 400 <= not_json.status_code < 500
    detail = requests.post(f"{_endpoint()}/predict", json=cases["missing feature"], timeout=10).json()["detail"]
    assert detail[0]["loc"][-1] == "alcohol" and "missing" in detail[0]["msg"]
    ordered = requests.post(f"{_endpoint()}/predict", json={"instances": [list(row.values())]}, timeout=10)
    assert ordered.status_code == 200


@pytest.mark.integration
def test_serve_api_key_required_when_configured(models):
    trained, data = models
    os.environ["AIRFLOW_CONN_SERVE_API_KEY"] = json.dumps({"conn_type": "generic", "password": "s3cret"})
    try:
        _, state = _deploy("serve_deploy_keyed", model=trained["good"], data=data)
    finally:
        os.environ.pop("AIRFLOW_CONN_SERVE_API_KEY", None)
    assert state == "success"
    url = f"{_endpoint('/keyed')}/predict"
    assert requests.post(url, json={"instances": [_row()]}, timeout=10).status_code == 401
    assert requests.post(url, json={"instances": [_row()]}, headers={"X-API-Key": "wrong"}, timeout=10).status_code == 401
    good = requests.post(url, json={"instances": [_row()]}, headers={"X-API-Key": "s3cret"}, timeout=10)
    assert good.status_code == 200 and good.json()["model_version"] == trained["good"]["model_version"]
    assert requests.get(f"{_endpoint('/keyed')}/metadata", timeout=10).status_code == 401


@pytest.mark.integration
def test_serve_binds_to_loopback_only(models, ray_conn):
    _ensure_deployed(*models)
    import psutil
    from urllib.parse import urlsplit

    state = RayHook().get_serve_applications()
    assert state["http_options"]["host"] == "127.0.0.1"
    port = urlsplit(RayHook().serve_url).port
    listening = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {"127.0.0.1"}
    # HAProxy's own stats and metrics listeners too (airflow_ray_ml_stages/haproxy_loopback.sh rewrites their binds)
    from airflow_ray_ml_stages.localcluster import session_pids

    cluster = ray_conn
    haproxy = [pid for pid in session_pids(cluster.leader_pids[0]) if psutil.Process(pid).name() == "haproxy"]
    assert haproxy, "Serve should run its ingress through HAProxy on the clusters we start"
    bound = {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN and c.pid in haproxy}
    assert len(bound) >= 2 and {ip for ip, _ in bound} == {"127.0.0.1"}, bound
