"""RayServeDeployOperator and the Serve app, against a real local Ray cluster and real HTTP calls.

The models are the session's ``trained_models`` and the request checks go to its ``served_champion``
(tests/conftest.py); the deploys here go to applications of this module's own, deleted when it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
import requests

from airflow.sdk import DAG
from airflow_ray_ml.compat import AirflowFailException

from airflow_ray_ml.errors import InvalidSpecError, ServeAppOwnershipError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.serve_apps import APP_IMPORT_PATH, OWNER_KEY, app_owner, check_ownership
from airflow_ray_ml.serve_config import SERVE_START_DEFAULTS, instance_settings
from airflow_ray_ml.serve_gate import gate
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TEST_PREDICTIONS_NAME
from tests.conftest import load_dag, serve_apps_deleted_after_module
from tests.dag_fixtures.serve_dags import SERVE_DEPLOY_MODEL
from tests.dags.wine_runs import asset_events
from tests.operators.test_ray_job import _xcom

_RUNS = iter(range(1, 1000))
delete_own_serve_apps = serve_apps_deleted_after_module("wine-test", "wine-keyed", "wine-shared", "wine-instance")


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


@pytest.fixture
def models(trained_models) -> tuple[dict[str, dict], dict]:
    """The session's three models (worse < good < better on one test split) and that split's XCom."""
    return trained_models.models, trained_models.data


def _endpoint(prefix: str = "/wine-test") -> str:
    return f"{RayHook().serve_url}{prefix}"


def _row() -> dict:
    return {"fixed acidity": 7.4, "volatile acidity": 0.7, "citric acid": 0.0, "residual sugar": 1.9,
            "chlorides": 0.076, "free sulfur dioxide": 11.0, "total sulfur dioxide": 34.0,
            "density": 0.9978, "pH": 3.51, "sulphates": 0.56, "alcohol": 9.4, "type": "red"}


def _served_version(prefix: str = "/wine-test", **headers) -> str:
    return requests.get(f"{_endpoint(prefix)}/health", headers=headers, timeout=10).json()["model_version"]


def _history(app: str = "wine-test") -> list[dict]:
    return artifacts.read_json(artifacts.join(RayHook().artifact_root, "serving", app, "history.json"))


def _broken(model: dict, version: str) -> dict:
    """A copy of ``model`` whose artifact cannot load, with a test metric that passes any gate: without
    its answers to the test rows, the gate compares that metric plainly."""
    broken_dir = f"{model['model_dir']}-{version}"
    shutil.copytree(model["model_dir"], broken_dir)
    with open(os.path.join(broken_dir, "model.ubj"), "wb") as handle:
        handle.write(b"not a model")
    os.remove(os.path.join(broken_dir, TEST_PREDICTIONS_NAME))
    return {**model, "model_dir": broken_dir, "model_version": version, "metrics": {"test": {"rmse": 0.01}}}


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
                    failures.append((reply.status_code, reply.text[:160]))  # which server answered, and why
                else:
                    versions.add(reply.json()["model_version"])
            except requests.RequestException as err:
                failures.append(type(err).__name__)
            time.sleep(0.02)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        swap_run, state = _deploy("serve_deploy", model=trained["better"], data=data)
        time.sleep(1)
    finally:
        stop.set()
        loader.join()
    assert state == "success"
    assert failures == []
    assert versions == {trained["good"]["model_version"], trained["better"]["model_version"]}
    assert _served_version() == trained["better"]["model_version"]
    # promoted beyond the test rows' noise: both models answered every test row (the champion over
    # HTTP, the challenger from its model directory) and it was ahead in nearly every resample
    swap = _xcom(swap_run, "deploy", key="decision")
    assert swap["confidence"] >= swap["min_confidence"] == 0.95
    assert f"better in {swap['confidence']:.1%}" in swap["reason"]

    # 3. A worse model is kept out: the task is skipped and the champion still answers.
    kept_run, state = _deploy("serve_deploy", model=trained["worse"], data=data)
    assert state == "skipped"
    decision = _xcom(kept_run, "deploy", key="decision")
    assert decision["action"] == "kept_champion"
    assert decision["champion_version"] == trained["better"]["model_version"]
    assert decision["challenger"] > decision["champion"] and decision["confidence"] < 0.05
    assert _served_version() == trained["better"]["model_version"]
    assert _history()[-1]["action"] == "kept_champion"
    # the deploy's Asset has an event for each promotion and none for the challenger kept out, so
    # what the promotion schedules (the wine pipeline's batch scoring) does not run again
    events = [event.get("model_version") for event in asset_events(SERVE_DEPLOY_MODEL.name)]
    assert events[-2:] == [trained["good"]["model_version"], trained["better"]["model_version"]]
    assert trained["worse"]["model_version"] not in events

    # 4. A broken artifact (forced past the gate) is rolled back; the old version keeps answering.
    # The task fails on its first try: a retry would deploy the same model and roll it back again.
    broken_run, state = _deploy("serve_deploy", model=_broken(trained["good"], "broken-1"), data=data)
    assert state == "failed"
    assert [ti.try_number for ti in broken_run.get_task_instances()] == [1]
    assert _served_version() == trained["better"]["model_version"]
    assert _history()[-1]["action"] == "rolled_back"
    actions = [entry["action"] for entry in _history()]
    assert actions == ["promoted", "promoted", "kept_champion", "rolled_back"]
    previous = artifacts.read_json(artifacts.join(RayHook().artifact_root, "serving", "wine-test",
                                                  "previous_config.json"))
    assert previous["version"] == trained["better"]["model_version"]


@pytest.mark.integration
def test_serve_malformed_requests_get_4xx_with_field_messages(served_champion):
    # serve_champion names no application or route: both are derived from its DAG id
    assert served_champion.deploy["endpoint"] == served_champion.endpoint
    predict = f"{served_champion.endpoint}/predict"
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
        reply = requests.post(predict, json=body, timeout=30)
        assert 400 <= reply.status_code < 500, (name, reply.status_code, reply.text[:200])
        assert reply.json()["detail"], name
    not_json = requests.post(predict, data="{",
                             headers={"content-type": "application/json"}, timeout=10)
    assert 400 <= not_json.status_code < 500
    detail = requests.post(predict, json=cases["missing feature"], timeout=10).json()["detail"]
    assert detail[0]["loc"][-1] == "alcohol" and "missing" in detail[0]["msg"]
    # Rows as lists are refused: they depend on the served model's column order (serve-deploy.md).
    ordered = requests.post(predict, json={"instances": [list(row.values())]}, timeout=10)
    assert ordered.status_code == 422 and ordered.json()["detail"][0]["type"] == "dict_type"


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
def test_serve_binds_to_loopback_only(served_champion, ray_conn):
    import psutil
    from urllib.parse import urlsplit

    state = RayHook().get_serve_applications()
    assert state["http_options"]["host"] == "127.0.0.1"
    port = urlsplit(RayHook().serve_url).port
    listening = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {"127.0.0.1"}
    # HAProxy's own stats and metrics listeners too (scripts/haproxy_loopback.sh rewrites their binds)
    from scripts.localcluster import session_pids

    cluster = ray_conn
    haproxy = [pid for pid in session_pids(cluster.leader_pids[0]) if psutil.Process(pid).name() == "haproxy"]
    assert haproxy, "Serve should run its ingress through HAProxy on the clusters we start"
    bound = {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN and c.pid in haproxy}
    assert len(bound) >= 2 and {ip for ip, _ in bound} == {"127.0.0.1"}, bound
    # The head's fallback proxy (HAProxy's backup while an application has no running replica, as
    # during a hot swap) listens on this cluster's own port, not Ray's fixed 8500 that another
    # cluster on the machine would share through SO_REUSEPORT.
    fallback = int(psutil.Process(cluster.leader_pids[0]).environ()["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"])
    assert fallback != 8500
    owners = {c.pid for c in psutil.net_connections(kind="inet")
              if c.status == psutil.CONN_LISTEN and c.laddr == ("127.0.0.1", fallback)}
    assert owners and owners <= set(session_pids(cluster.leader_pids[0])), owners


def _app_config(owner: str | None, import_path: str = APP_IMPORT_PATH) -> dict:
    """An application's entry in Serve's state, as the REST API returns it."""
    user_config = {"model_dir": "/m", "model_version": "v1", **({OWNER_KEY: owner} if owner else {})}
    return {"deployed_app_config": {"name": "wine", "import_path": import_path,
                                    "deployments": [{"name": "ModelServer", "user_config": user_config}]}}


def test_check_ownership_refuses_another_dags_app_naming_owner_app_and_the_fix():
    with pytest.raises(ServeAppOwnershipError) as refused:
        check_ownership("wine", _app_config("dag_a"), "dag_b", allow_takeover=False)
    assert isinstance(refused.value, AirflowFailException)  # fails at once, never retried
    message = str(refused.value)
    assert "'wine'" in message and "'dag_a'" in message and "'dag_b'" in message
    assert "allow_takeover=True" in message and "app_name" in message
    assert check_ownership("wine", _app_config("dag_a"), "dag_b", allow_takeover=True) == "DAG 'dag_a'"


@pytest.mark.parametrize(("live_app", "dag_id"), [
    (None, "dag_b"),                    # not live: a new application
    (_app_config("dag_b"), "dag_b"),    # this DAG's own
    (_app_config(None), "dag_b"),       # deployed by this operator before owners were recorded
])
def test_check_ownership_own_new_or_unrecorded_app_deploys(live_app, dag_id):
    assert check_ownership("wine", live_app, dag_id, allow_takeover=False) is None


@pytest.mark.parametrize("live_app", [
    _app_config(None, import_path="someone.else:app"),  # another project's config
    {"deployed_app_config": None, "status": "RUNNING"},  # deployed from code (serve.run), no config
])
def test_check_ownership_app_not_deployed_by_the_operator_refused_unless_allowed(live_app):
    with pytest.raises(ServeAppOwnershipError, match="not deployed by RayServeDeployOperator"):
        check_ownership("wine", live_app, "dag_b", allow_takeover=False)
    assert check_ownership("wine", live_app, "dag_b", allow_takeover=True)


def _resolved_names(dag_id: str, **kwargs) -> tuple[str, str]:
    """The app_name and route_prefix of a deploy task in DAG ``dag_id``, resolved as execute resolves
    them: the templates rendered, then the names checked (those left out derived)."""
    with DAG(dag_id=dag_id, schedule=None, start_date=datetime(2026, 1, 1)):
        task = RayServeDeployOperator(task_id="deploy", model={}, **kwargs)
    task.render_template_fields({"params": {"app": "flats", "route": "/rent/flats", "empty": ""}})
    task.check_endpoint_names()
    return task.app_name, task.route_prefix


@pytest.mark.parametrize(("dag_id", "app_name"), [
    ("sales_forecast", "sales_forecast"),
    ("_nightly.prévisions", "nightly.pr-visions"),    # starts with a letter; a run of others is one '-'
    ("a" * 200, "a" * 63),                            # cut to the longest name APP_NAME allows
])
def test_deploy_without_names_serves_its_dag_id_as_the_app_and_route(dag_id, app_name):
    assert _resolved_names(dag_id) == (app_name, f"/{app_name}")


def test_deploy_names_given_win_and_a_route_left_out_follows_the_app_name():
    assert _resolved_names("sales", app_name="{{ params.app }}", route_prefix="{{ params.route }}") == (
        "flats", "/rent/flats")
    assert _resolved_names("sales", app_name="flats") == ("flats", "/flats")
    assert _resolved_names("sales", route_prefix="/v2/sales") == ("sales", "/v2/sales")
    # a Param rendered empty is a name left out
    assert _resolved_names("sales", app_name="{{ params.empty }}", route_prefix="{{ params.empty }}") == (
        "sales", "/sales")


def test_deploy_without_names_and_no_usable_dag_id_says_to_pass_app_name():
    with pytest.raises(InvalidSpecError, match=r"from DAG id '___'.*pass app_name="):
        _resolved_names("___")
    with pytest.raises(InvalidSpecError, match=r"in no DAG to name its Serve application after; pass app_name="):
        RayServeDeployOperator(task_id="deploy", model={}).check_endpoint_names()


def test_instance_settings_kept_when_live_defaults_when_not_and_asked_for_ones_applied():
    live = {"proxy_location": "EveryNode", "http_options": {"host": "0.0.0.0", "port": 8123},
            "target_capacity": 50.0}
    defaults = {**SERVE_START_DEFAULTS, "http_options": {"host": "127.0.0.1", "port": 8000}}
    assert instance_settings(live, defaults, None) == (live, [])
    assert instance_settings(None, defaults, None) == (defaults, [])
    # not running: asked-for settings go over the defaults, a dict one key by key
    started, _ = instance_settings(None, defaults, {"http_options": {"keep_alive_timeout_s": 9},
                                                    "proxy_location": "EveryNode"})
    assert started == {"proxy_location": "EveryNode",
                       "http_options": {"host": "127.0.0.1", "port": 8000, "keep_alive_timeout_s": 9}}
    # running: what Serve takes live changes; what it takes only at start stays, and is named
    settings, not_applied = instance_settings(live, defaults, {"target_capacity": 80, "proxy_location": "HeadOnly",
                                                               "http_options": {"port": 8123}})
    assert settings == {**live, "target_capacity": 80}
    assert not_applied == ["proxy_location"]  # the port asked for is the live one


def _live_owner(app: str) -> str | None:
    return app_owner(RayHook().get_serve_applications()["applications"][app]["deployed_app_config"])


@pytest.mark.integration
def test_serve_app_of_another_dag_refused_unless_takeover_allowed(models):
    trained, data = models
    good, better = trained["good"]["model_version"], trained["better"]["model_version"]

    # DAG A deploys the application and is recorded as its owner.
    _, state = _deploy("serve_shared_a", model=trained["good"], data=data)
    assert state == "success"
    assert _live_owner("wine-shared") == "serve_shared_a"
    history = _history("wine-shared")
    assert history[-1]["owner"] == "serve_shared_a"

    # DAG B, same application, a better model: refused at once, on its first try, nothing changed.
    refused_run, state = _deploy("serve_shared_b", model=trained["better"], data=data)
    refused = refused_run.get_task_instance("deploy")
    assert state == "failed" and refused.try_number == 1
    answer = requests.post(f"{_endpoint('/shared')}/predict", json={"instances": [_row()]}, timeout=10)
    assert answer.status_code == 200 and answer.json()["model_version"] == good
    assert _live_owner("wine-shared") == "serve_shared_a"
    assert _history("wine-shared") == history

    # Allowed: B's model is served, and B owns the application from then on.
    _, state = _deploy("serve_shared_b", model=trained["better"], data=data, allow_takeover=True)
    assert state == "success"
    assert _served_version("/shared") == better
    assert _live_owner("wine-shared") == "serve_shared_b"
    assert {k: _history("wine-shared")[-1][k] for k in ("action", "owner", "previous_owner")} == {
        "action": "promoted", "owner": "serve_shared_b", "previous_owner": "serve_shared_a"}


_INSTANCE_SETTINGS = ("proxy_location", "http_options", "grpc_options", "target_capacity")


def _instance() -> dict:
    """The Serve instance's settings that the REST API reports."""
    state = RayHook().get_serve_applications()
    return {key: state.get(key) for key in _INSTANCE_SETTINGS}


def _put_instance(**settings) -> None:
    """Set instance settings through the REST API, every live application kept as it is.

    A Serve that is not running yet is started here, with a keep-alive other than the operator's.
    """
    hook = RayHook()
    state = hook.get_serve_applications()
    live = {key: state[key] for key in _INSTANCE_SETTINGS if state.get(key) is not None}
    if not live.get("proxy_location"):
        port = int(hook.serve_url.rsplit(":", 1)[1])
        live = {"proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 7}}
    applications = [app["deployed_app_config"] for app in state["applications"].values()
                    if app.get("deployed_app_config")]
    hook.put_serve_applications({**live, **settings, "applications": applications})


@pytest.mark.integration
def test_serve_deploy_keeps_instance_settings_unless_asked_even_on_rollback(models):
    trained, data = models
    _put_instance(target_capacity=90)  # an instance-wide setting a deploy could reset
    try:
        before = _instance()
        assert before["target_capacity"] == 90 and before["proxy_location"]

        # Not asked: a deploy leaves every instance setting as it is.
        _, state = _deploy("serve_instance", model=trained["good"], data=data)
        assert state == "success"
        assert _instance() == before

        # Asked: the setting Serve takes live changes; the one it takes only at start does not.
        options = {"target_capacity": 80, "http_options": {"keep_alive_timeout_s": 11}}
        _, state = _deploy("serve_instance", model=trained["better"], data=data, serve_instance_options=options)
        assert state == "success"
        assert _instance() == {**before, "target_capacity": 80}

        # A failed deploy is rolled back with the settings as they were before it.
        _, state = _deploy("serve_instance", model=_broken(trained["good"], "broken-instance"), data=data,
                           serve_instance_options={"target_capacity": 70})
        assert state == "failed"
        assert _history("wine-instance")[-1]["action"] == "rolled_back"
        assert _instance() == {**before, "target_capacity": 80}
        assert _served_version("/instance") == trained["better"]["model_version"]
    finally:
        _put_instance(target_capacity=None)
