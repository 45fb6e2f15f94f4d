"""Test set-up: a throw-away AIRFLOW_HOME, one real local Ray cluster for the integration tests, and
what is expensive to make, made once per test run and then only read.

The environment is fixed here, before any test module imports airflow, so tests never touch a
developer's own Airflow home or the cluster that ``make run`` may have started.

``make test`` runs two pytest-xdist workers (``TEST_WORKERS``); each is a test run of its own, with its
own Airflow home, ports and session fixtures, and the modules that read the same expensive
session fixture run in the same worker (``pytest_collection_modifyitems`` below).

What a test run starts, each only when a selected test first asks for it (session fixtures):

- ``airflow_db``: the metadata database (SQLite in the throw-away AIRFLOW_HOME), migrated once;
- ``ray_cluster`` / ``ray_conn``: one 2-CPU Ray head, without GPUs, on free ports with token auth,
  that the integration tests share through the ``ray_default`` connection; stopped at the end;
- ``trained_models``: three XGBoost regression models of known quality on one split, trained as
  Ray jobs by one run of the ``serve_models`` DAG, and new rows to score;
- ``served_champion``: the good one of those, served on that cluster's Ray Serve for the whole run;
- ``failed_tune_run``: a Tune run whose every trial fails, with its task note;
- ``s3_server``: a SeaweedFS S3 server on loopback, for the ``s3`` tests.

Besides these, a test that needs another shape of cluster (a GPU, eight CPUs, two nodes) starts it
with ``extra_cluster`` and stops it when done; a module fixture may train what only its module needs.
Tests never change what a session fixture made: one that changes Serve state deploys applications
of its own names and deletes them when its module ends (``serve_apps_deleted_after_module``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each pytest-xdist worker (`make test` runs two) is a test run of its own: its own AIRFLOW_HOME,
# metadata DB and session cluster. Subprocesses that a test starts (a worker to kill) inherit the
# home of the run that started them and share its metadata DB.
_RUN = os.environ.get("PYTEST_XDIST_WORKER", "main")
_INHERITED = "RAYML_TEST_AIRFLOW_HOME" in os.environ and os.environ.get("RAYML_TEST_RUN") == _RUN
_HOME = (os.environ["RAYML_TEST_AIRFLOW_HOME"] if _INHERITED
         else tempfile.mkdtemp(prefix="airflow-ray-ml-test-"))
os.environ.update({
    "RAYML_TEST_RUN": _RUN,
    "RAYML_TEST_AIRFLOW_HOME": _HOME,
    "AIRFLOW_HOME": _HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
    "RAY_USAGE_STATS_ENABLED": "0",
    # The project's DAGs and the tests' own small DAGs, each in a bundle, so dag.test() finds both.
    # The tests' first: a DAG's first dag.test() parses and serializes the bundles in this order
    # until one holds it, and serializing the wine pipeline (its many Params, in every task) takes
    # a few tenths of a second, which the tests' fifty DAGs then skip.
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
        {"name": "test-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(ROOT / "tests" / "dag_fixtures")}},
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(ROOT / "dags")}},
    ]),
})
if not _INHERITED:  # a developer's own settings must not leak into the tests
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "AIRFLOW_CONN_RAY_DEFAULT",
                 "RAYML_ARTIFACT_ROOT"):
        os.environ.pop(name, None)
    os.environ["AIRFLOW__OPENLINEAGE__DISABLED"] = "True"  # no lineage but tests/dags/test_lineage.py's
# The interpreter whose Ray runs the test clusters and their jobs (unset: this one, as in `make
# test-lowest`, whose cluster side runs the `ml` extra at its lowest versions too). Another venv's
# puts the Airflow side and the cluster side in two environments, as in a deployment.
RAY_PYTHON = os.environ.get("RAYML_TEST_RAY_PYTHON") or None
for path in (ROOT, ROOT / "include"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from scripts.localcluster import PORT_RANGE_ENV, interrupt_on_termination, split_ports  # noqa: E402

if not _INHERITED and "PYTEST_XDIST_WORKER" in os.environ:  # each worker its own ports to pick from
    os.environ[PORT_RANGE_ENV] = split_ports(int(_RUN.removeprefix("gw")),
                                             int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))

# A suite stopped by SIGTERM (a CI timeout, `timeout`) still tears its fixtures down: the clusters stop.
interrupt_on_termination()

_RUN_DIRS: list[str] = [] if _INHERITED else [_HOME]


def run_dir(prefix: str) -> str:
    """A new dir directly under /tmp (short: a test cluster's sockets live in it) that this test run
    removes when it ends, unless a test failed: then it names the dirs it kept (the Ray logs)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    _RUN_DIRS.append(path)
    return path


def pytest_sessionfinish(session, exitstatus):
    if session.testsfailed or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        if len(_RUN_DIRS) > 1:
            print(f"\nkept this run's Airflow home and Ray clusters' dirs (logs): {' '.join(_RUN_DIRS)}")
        return
    for path in _RUN_DIRS:
        shutil.rmtree(path, ignore_errors=True)


SHARED_SESSION_FIXTURES = ("wine_regression", "trained_models", "served_champion", "failed_tune_run", "s3_server",
                           "fake_gpu_cluster")
"""What a session makes once and several modules read: the modules that ask for one of these run
in the same pytest-xdist worker, so it is made once per test run, not once per worker."""


def xdist_groups(fixtures_by_module: dict[str, set[str]],
                 shared: tuple[str, ...] = SHARED_SESSION_FIXTURES) -> dict[str, str]:
    """Each test module's group: its own name, or where modules ask for the same fixture of
    ``shared``, one name (the first such module's) for all of them, transitively."""
    parent = {module: module for module in fixtures_by_module}

    def root(module: str) -> str:
        while parent[module] != module:
            module = parent[module]
        return module

    first: dict[str, str] = {}  # fixture -> the first module that asked for it
    for module, fixtures in fixtures_by_module.items():
        for name in shared:
            if name in fixtures:
                joined, own = root(first.setdefault(name, module)), root(module)
                if joined != own:
                    parent[own] = joined
    return {module: root(module) for module in fixtures_by_module}


def dispatch_key(groups: dict[str, str], integration_groups: set[str]):
    """The order the workers get the groups in, as a sort key of a test's module: the longest first,
    so that a run ends on short tests that both workers share, not with one worker busy for a
    minute and the other idle. First the groups that share a session fixture (minutes each), then
    the others with an integration test (a Ray job or a cluster: seconds to a minute), then those
    without (milliseconds to seconds)."""
    shared = {group for module, group in groups.items() if module != group}
    return lambda module: (groups[module] not in shared, groups[module] not in integration_groups)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Put each test in an ``xdist_group`` (``make test`` runs ``--dist loadgroup``): its module's,
    or, where modules share a fixture of ``SHARED_SESSION_FIXTURES``, one group for all of them. A
    module's tests stay together: its module fixtures run once. Without pytest-xdist (a GPU host's
    ``make test-gpu``), nothing."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    module = {item: item.nodeid.split("::")[0] for item in items}
    fixtures_by_module: dict[str, set[str]] = {}
    for item in items:
        fixtures_by_module.setdefault(module[item], set()).update(getattr(item, "fixturenames", ()))
    groups = xdist_groups(fixtures_by_module)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[module[item]]))
    integration = {groups[module[item]] for item in items if item.get_closest_marker("integration")}
    key = dispatch_key(groups, integration)
    items.sort(key=lambda item: key(module[item]))  # stable: the random order stays


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_group_ids(config, items):
    """In a worker, after pytest-xdist's hook: the test ids its scheduler splits by group.

    pytest-xdist 3.8 writes a group into a test's id as ``<id>@<group>`` through ``Item._nodeid``,
    which pytest 9 no longer reads (the id is ``Item._id``, a ``NodeId``): every test then went out
    alone and a module's fixtures ran in both workers. Where its suffix is missing, it is set here.
    """
    if not getattr(config, "workerinput", None) or not config.getvalue("loadgroup"):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker and not item.nodeid.endswith(f"@{marker.args[0]}"):
            item._id = NodeId.parse(f"{item.nodeid}@{marker.args[0]}")


@pytest.fixture(scope="session")
def airflow_db() -> str:
    """An initialised metadata database (``airflow db migrate``) in the test AIRFLOW_HOME."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                   stdout=subprocess.DEVNULL, env=os.environ.copy())
    return os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]


def serialize_project_dags() -> None:
    """Write the project's DAGs (``dags/``) to the test metadata DB, as Airflow's DAG processor does,
    so the api-server and a scheduler know them."""
    subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize", "--bundle-name", "dags-folder"],
                   check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())


def dag_bag(folder: Path):
    """The DAGs of ``folder``, parsed the way Airflow parses them."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1 keeps it in airflow.models
        from airflow.models.dagbag import DagBag
    return DagBag(dag_folder=str(folder))


def load_dag(dag_id: str, folder: Path = ROOT / "tests" / "dag_fixtures"):
    """A DAG from one of the bundles, parsed the way Airflow parses it."""
    bag = dag_bag(folder)
    assert not bag.import_errors, bag.import_errors
    return bag.dags[dag_id]


def _cuda_usable() -> bool:
    """Whether CUDA can use a GPU here. With no NVIDIA device node (nor WSL's GPU device) it cannot,
    and torch is not imported: 1.5 CPU-s in every process that imports this module (each pytest
    worker and each child a test starts)."""
    if not any(glob.glob(pattern) for pattern in ("/dev/nvidia[0-9]*", "/dev/dxg")):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not _cuda_usable(), reason="no CUDA GPU on this machine")
"""Skip marker for the ``gpu`` tests: they run only where CUDA can use a GPU."""


def _airflow_before(release: str) -> bool:
    from importlib.metadata import version

    from packaging.version import Version

    return Version(version("apache-airflow-core")) < Version(release)


AIRFLOW_BEFORE_3_2 = _airflow_before("3.2")
"""Airflow 3.1 (`make test-lowest`): for the few tests of what 3.1 does otherwise, each with its reason."""


def _ml_extra_missing() -> list[str]:
    """The distributions of the `ml` extra (pyproject.toml) that are not installed here, Ray aside."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    missing = []
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["ml"]:
        name = Requirement(line).name
        if name == "ray":
            continue  # a runtime dependency; its extras' packages come with these or not at all
        try:
            version(name)
        except PackageNotFoundError:
            missing.append(name)
    return missing


ML_EXTRA_MISSING = _ml_extra_missing()
_NO_ML_EXTRA = (f"needs the `ml` extra ({', '.join(ML_EXTRA_MISSING)} not installed): an Airflow-only venv, "
                "as `make test-lowest`'s, whose Ray side is another environment")
requires_ml_extra = pytest.mark.skipif(bool(ML_EXTRA_MISSING), reason=_NO_ML_EXTRA)
"""Skip marker for a test that trains, loads or serves a model, or plots, in the test's own process."""


def skip_without_ml_extra() -> None:
    """``requires_ml_extra`` for a fixture: the tests that ask for it skip where the `ml` extra is missing."""
    if ML_EXTRA_MISSING:
        pytest.skip(_NO_ML_EXTRA)


TEST_CLUSTER_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}
"""What every test cluster's nodes get in their environment. A Serve replica that is stopped (its
application deleted, or scaled down) stays reachable for Ray's deregistration window before it
drains, 30 s by default, for load balancers on other nodes; behind a node's own HAProxy, which
retries a refused connection on another replica, 1 s is enough, and a test that deletes an
application or a module's cleanup no longer waits half a minute for it."""


@contextlib.contextmanager
def extra_cluster(conn_id: str, **cluster_kwargs):
    """Another real local Ray head (e.g. one advertising a GPU) reached through connection ``conn_id``.

    It advertises no GPU unless ``num_gpus`` says (None: the GPUs Ray detects), so the CPU paths
    run the same on a machine with a GPU.
    """
    from scripts.localcluster import LocalRayCluster, new_token

    cluster = LocalRayCluster(temp_dir=run_dir("rx"), token=new_token(),
                              **{"num_cpus": 2, "num_gpus": 0, "python": RAY_PYTHON, **cluster_kwargs,
                                 "extra_env": {**TEST_CLUSTER_ENV, **cluster_kwargs.get("extra_env", {})}})
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    before = os.environ.get(variable)  # a session's head of that name, while a test's own replaces it
    try:
        cluster.start()
        os.environ[variable] = json.dumps({
            "conn_type": "ray_ml",
            "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token,
                      "artifact_root": run_dir(f"{conn_id}-artifacts-")},
        })
        yield cluster
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before
        cluster.stop()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real 2-CPU Ray head on free ports with token auth, stopped (by its session) afterwards.

    It advertises no GPU even where Ray would find one: the suite tests the CPU path here, and the
    ``gpu`` tests start a cluster of their own with the GPU (``make test-gpu``).

    Its environment is ``TEST_CLUSTER_ENV``'s."""
    from scripts.localcluster import LocalRayCluster, new_token

    cluster = LocalRayCluster(temp_dir=run_dir("rt"), num_cpus=2, num_gpus=0, token=new_token(), python=RAY_PYTHON,
                              extra_env=TEST_CLUSTER_ENV)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def fake_gpu_cluster(airflow_db):
    """A head that advertises one GPU whether or not this machine has one CUDA can use (connection
    ``ray_fake_gpu``): Ray hands it to whatever asks. The probe's and the train stage's tests share it."""
    with extra_cluster("ray_fake_gpu", num_gpus=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture(scope="session")
def ray_conn(ray_cluster, artifact_root):
    """Point the ``ray_default`` connection at the test cluster (dashboard URL, token, artifacts, and a
    free port for Ray Serve's HTTP proxy)."""
    from scripts.localcluster import free_port

    os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps({
        "conn_type": "ray_ml",
        "extra": {"dashboard_url": ray_cluster.dashboard_url, "auth_token": ray_cluster.token,
                  "artifact_root": artifact_root, "serve_url": f"http://127.0.0.1:{free_port()}"},
    })
    yield ray_cluster
    os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)


def serve_apps_deleted_after_module(*names: str):
    """A fixture that deletes the Serve applications ``names`` from the session cluster when the test
    module that holds it ends. A module that deploys applications declares them, at module level::

        delete_own_serve_apps = serve_apps_deleted_after_module("wine-test", "wine-keyed")

    Every replica reserves CPU on the 2-CPU test cluster: applications left over from earlier modules
    once took the CPUs that a later module's Ray Data or Serve needed, and in some orders those tests
    waited until their timeout. Only the names given are deleted, so the session's served champion
    (and any other module's applications) stay.
    """

    @pytest.fixture(scope="module", autouse=True)
    def delete_own_serve_apps():
        yield
        if "AIRFLOW_CONN_RAY_DEFAULT" in os.environ:  # the session cluster is up: the module may have deployed
            _delete_serve_applications(set(names))

    return delete_own_serve_apps


def _delete_serve_applications(names: set[str], timeout_s: float = 120.0) -> None:
    """Delete those of ``names`` that are live on the session cluster's Serve, keeping its other
    applications and its instance settings, and wait until their replicas are gone."""
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.serve_config import live_applications, live_instance_settings

    hook = RayHook()
    state = hook.get_serve_applications()
    names = names & set(state.get("applications") or {})
    if not names:
        return
    kept = [app for app in live_applications(state) if app.get("name") not in names]
    hook.put_serve_applications({**(live_instance_settings(state) or {}), "applications": kept})
    deadline = time.monotonic() + timeout_s
    while names & set(hook.get_serve_applications().get("applications") or {}):
        assert time.monotonic() < deadline, f"Serve applications {sorted(names)} not deleted in {timeout_s:.0f} s"
        time.sleep(1)


def xcom(dag_run, task_id: str, key: str = "return_value"):
    """The XCom ``key`` that task ``task_id`` pushed in ``dag_run``, decoded."""
    from tests.operators.test_ray_job import _xcom

    return _xcom(dag_run, task_id, key)


@dataclass(frozen=True)
class TrainedModels:
    """Three XGBoost regression models trained on one split, of known quality: on its test rows
    ``models["worse"]`` < ``models["good"]`` < ``models["better"]``.

    :param models: each model's train XCom (``model_dir``, ``model_version``, ``metrics``, ...), by name.
    :param data: the preprocess XCom of the split they were trained on.
    :param source: the generated wine files that split was made from.
    :param new_rows: generated wine files without the label, in the published UCI layout, to score.
    """

    models: dict[str, dict]
    data: dict
    source: list[str]
    new_rows: list[str]


@pytest.fixture(scope="session")
def trained_models(airflow_db, ray_conn) -> TrainedModels:
    """The models of ``TrainedModels``, trained once per test run by the ``serve_models`` DAG
    (tests/dag_fixtures/serve_dags.py: generate, preprocess, three trainings and new rows, each a Ray
    job). Tests read them; a test that must change a model directory copies it first."""
    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    dag_run = load_dag("serve_models").test(logical_date=when, run_after=when)
    assert dag_run.state == "success"
    models = {name: xcom(dag_run, f"train_{name}") for name in ("worse", "good", "better")}
    rmse = {name: model["metrics"]["test"]["rmse"] for name, model in models.items()}
    assert rmse["better"] < rmse["good"] < rmse["worse"], rmse  # what the tests take as given
    return TrainedModels(models=models, data=xcom(dag_run, "preprocess"),
                         source=xcom(dag_run, "demo_data")["data_uris"], new_rows=xcom(dag_run, "new_wines")["data_uris"])


@dataclass(frozen=True)
class ServedChampion:
    """A model served on the session cluster's Ray Serve.

    :param app: the Serve application's name.
    :param endpoint: its base URL (``<endpoint>/predict``, ``/health``, ``/metadata``).
    :param model: the served model's train XCom.
    :param data: the preprocess XCom of the split it was trained on.
    :param deploy: the deploy task's XCom.
    """

    app: str
    endpoint: str
    model: dict
    data: dict
    deploy: dict


@pytest.fixture(scope="session")
def served_champion(trained_models) -> ServedChampion:
    """``trained_models``' good model, promoted to Ray Serve once per test run by the real deploy
    operator (the ``serve_champion`` DAG, whose application and route are derived from its id) and
    served until the cluster stops. Tests only send it requests; one that deploys, rolls back or
    changes instance settings uses an application of its own."""
    from airflow_ray_ml.hooks.ray import RayHook

    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    model, data = trained_models.models["good"], trained_models.data
    dag_run = load_dag("serve_champion").test(logical_date=when, run_after=when,
                                              run_conf={"model": model, "data": data})
    assert dag_run.get_task_instance("deploy").state == "success"
    deploy = xcom(dag_run, "deploy")
    assert deploy["action"] == "promoted"
    return ServedChampion(app="serve_champion", endpoint=f"{RayHook().serve_url}/serve_champion", model=model,
                          data=data, deploy=deploy)


@pytest.fixture(scope="session")
def failed_tune_run(airflow_db, ray_conn, tmp_path_factory):
    """A run of the ``tune_only`` DAG (tests/dag_fixtures/tune_dags.py) whose every trial fails inside
    XGBoost (an unknown tree method), on 600 generated rows: the failed search, its manifest and
    leaderboard, and the note the listener wrote."""
    from tests.train_data import write_preprocessed

    preprocess = write_preprocessed(tmp_path_factory.mktemp("failed-tune-data"), rows=600, seed=3)
    when = datetime(2026, 6, 1, tzinfo=timezone.utc)
    dag_run = load_dag("tune_only").test(logical_date=when, run_after=when,
                                         run_conf={"preprocess": preprocess, "search_space": FAILING_SPACE})
    assert dag_run.state == "failed"
    return dag_run


FAILING_SPACE = {"family": "xgboost", "xgboost": {"num_boost_round": 5, "tree_method": "no_such_method"}}
"""A search space whose every trial fails inside XGBoost: an unknown tree method passes the spec's
validation (XGBoost has many keys) and fails in training."""


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (SeaweedFS) on loopback with one bucket, for the ``s3`` tests."""
    from tests.s3server import seaweedfs

    with seaweedfs() as server:
        yield server


def allow_sources(monkeypatch, *roots: str) -> None:
    """Widen the ``ray_default`` connection's allowed sources (airflow_ray_ml.confine) for one test, as
    an Airflow admin would in its ``allowed_sources`` field; the connection is otherwise kept as it is."""
    connection = json.loads(os.environ.get("AIRFLOW_CONN_RAY_DEFAULT") or '{"conn_type": "ray_ml"}')
    extra = connection.setdefault("extra", {})
    extra.setdefault("dashboard_url", os.environ.get("RAY_DASHBOARD_URL", "http://127.0.0.1:8265"))
    extra["allowed_sources"] = [*extra.get("allowed_sources", []), *map(str, roots)]
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(connection))
