"""Test set-up: a throw-away AIRFLOW_HOME, and a real local Ray cluster for integration tests.

The environment is fixed here, before any test module imports airflow, so tests never touch a
developer's own Airflow home or the cluster that ``make run`` may have started.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses that tests start (a worker to kill) inherit this and share the same metadata DB.
_INHERITED = "RAYML_TEST_AIRFLOW_HOME" in os.environ
_HOME = os.environ.get("RAYML_TEST_AIRFLOW_HOME") or tempfile.mkdtemp(prefix="airflow-ray-ml-test-")
os.environ.update({
    "RAYML_TEST_AIRFLOW_HOME": _HOME,
    "AIRFLOW_HOME": _HOME,
    "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
    "RAY_USAGE_STATS_ENABLED": "0",
    # The project's DAGs and the tests' own small DAGs, each in a bundle, so dag.test() finds both.
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(ROOT / "dags")}},
        {"name": "test-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(ROOT / "tests" / "dag_fixtures")}},
    ]),
})
if not _INHERITED:  # a developer's own settings must not leak into the tests
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "AIRFLOW_CONN_RAY_DEFAULT",
                 "RAYML_ARTIFACT_ROOT"):
        os.environ.pop(name, None)
    os.environ["AIRFLOW__OPENLINEAGE__DISABLED"] = "True"  # no lineage but tests/dags/test_lineage.py's
# The interpreter whose Ray runs the test clusters and their jobs (unset: this one). `make test-lowest`
# sets it to the main venv's: the Airflow side at its lowest versions, the cluster side (the `ml`
# extra) at the tested ones, two environments as in a deployment.
RAY_PYTHON = os.environ.get("RAYML_TEST_RAY_PYTHON") or None
for path in (ROOT, ROOT / "include"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from scripts.localcluster import interrupt_on_termination  # noqa: E402

# A suite stopped by SIGTERM (a CI timeout, `timeout`) still tears its fixtures down: the clusters stop.
interrupt_on_termination()


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
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not _cuda_usable(), reason="no CUDA GPU on this machine")
"""Skip marker for the ``gpu`` tests: they run only where CUDA can use a GPU."""


@contextlib.contextmanager
def extra_cluster(conn_id: str, **cluster_kwargs):
    """Another real local Ray head (e.g. one advertising a GPU) reached through connection ``conn_id``.

    It advertises no GPU unless ``num_gpus`` says (None: the GPUs Ray detects), so the CPU paths
    run the same on a machine with a GPU.
    """
    from scripts.localcluster import LocalRayCluster, new_token

    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="rx", dir="/tmp"), token=new_token(),
                              **{"num_cpus": 2, "num_gpus": 0, "python": RAY_PYTHON, **cluster_kwargs})
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    try:
        cluster.start()
        os.environ[variable] = json.dumps({
            "conn_type": "ray",
            "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token,
                      "artifact_root": tempfile.mkdtemp(prefix=f"{conn_id}-artifacts-")},
        })
        yield cluster
    finally:
        os.environ.pop(variable, None)
        cluster.stop()


@pytest.fixture(scope="session")
def ray_cluster():
    """A real 2-CPU Ray head on free ports with token auth, stopped (by its session) afterwards.

    It advertises no GPU even where Ray would find one: the suite tests the CPU path here, and the
    ``gpu`` tests start a cluster of their own with the GPU (``make test-gpu``)."""
    from scripts.localcluster import LocalRayCluster, new_token

    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    cluster = LocalRayCluster(temp_dir=temp_dir, num_cpus=2, num_gpus=0, token=new_token(), python=RAY_PYTHON)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture(scope="session")
def ray_conn(ray_cluster, artifact_root):
    """Point the ``ray_default`` connection at the test cluster (dashboard URL, token, artifacts, and a
    free port for Ray Serve's HTTP proxy)."""
    from scripts.localcluster import free_port

    os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps({
        "conn_type": "ray",
        "extra": {"dashboard_url": ray_cluster.dashboard_url, "auth_token": ray_cluster.token,
                  "artifact_root": artifact_root, "serve_url": f"http://127.0.0.1:{free_port()}"},
    })
    yield ray_cluster
    os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)


@pytest.fixture(scope="module", autouse=True)
def serve_apps_left_as_found():
    """Each test module leaves the session cluster's Serve as it found it: the applications that the
    module deployed are deleted when it ends (a module's own fixtures may share one deployment).

    Every application's replica reserves CPU on the 2-CPU test cluster; left to pile up over the
    modules, in some orders they took the CPUs that a later stage's Ray Data or Serve needed, and
    those tests waited until their timeout.
    """
    before = set(_session_serve_applications())
    yield
    _delete_serve_applications(set(_session_serve_applications()) - before)


def _session_serve_applications() -> dict:
    """The session cluster's live Serve applications ({} before ``ray_conn`` has pointed at it)."""
    if "AIRFLOW_CONN_RAY_DEFAULT" not in os.environ:
        return {}
    from airflow_ray_ml.hooks.ray import RayHook

    return RayHook().get_serve_applications().get("applications") or {}


def _delete_serve_applications(names: set[str], timeout_s: float = 120.0) -> None:
    """Delete ``names`` from the session cluster's Serve, keeping its other applications and its
    instance settings, and wait until their replicas are gone."""
    if not names:
        return
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.ray_serve import live_applications, live_instance_settings

    hook = RayHook()
    state = hook.get_serve_applications()
    kept = [app for app in live_applications(state) if app.get("name") not in names]
    hook.put_serve_applications({**(live_instance_settings(state) or {}), "applications": kept})
    deadline = time.monotonic() + timeout_s
    while names & set(hook.get_serve_applications().get("applications") or {}):
        assert time.monotonic() < deadline, f"Serve applications {sorted(names)} not deleted in {timeout_s:.0f} s"
        time.sleep(1)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (SeaweedFS) on loopback with one bucket, for the ``s3`` tests."""
    from tests.s3server import seaweedfs

    with seaweedfs() as server:
        yield server


def allow_sources(monkeypatch, *roots: str) -> None:
    """Widen the ``ray_default`` connection's allowed sources (airflow_ray_ml.confine) for one test, as
    an Airflow admin would in its ``allowed_sources`` field; the connection is otherwise kept as it is."""
    connection = json.loads(os.environ.get("AIRFLOW_CONN_RAY_DEFAULT") or '{"conn_type": "ray"}')
    extra = connection.setdefault("extra", {})
    extra.setdefault("dashboard_url", os.environ.get("RAY_DASHBOARD_URL", "http://127.0.0.1:8265"))
    extra["allowed_sources"] = [*extra.get("allowed_sources", []), *map(str, roots)]
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(connection))
