"""The package as a team would install it into its own Airflow.

The sdist and the wheel are built from this checkout with ``python -m build`` (the wheel from the
sdist, so a file the sdist lacks is missing from the wheel too), by the build backend of the test's
own environment (``--no-isolation``: constraints.txt pins it there, so no build environment is
installed twice per run). The wheel is installed with Airflow, at the versions in constraints.txt
and without the ``ml`` extra, into a fresh virtual environment, by the test environment's own pip
(the tested one, ``pip --python``), and that environment's own ``airflow`` must then see the
provider, the ``ray_ml`` connection type with its fields, the "Ray ML" page's plugin, with an
empty plugins folder, and the rollback DAG that the page's buttons run, from a DAGs folder
holding only this project's one-call ``dags/ray_serve_rollback.py``.

The install needs the package registry or pip's cache; the module skips only when the registry is
unreachable and the install cannot be satisfied without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.operators.fake_jobs_api import FakeJobsApi

pytestmark = [pytest.mark.integration, pytest.mark.packaging]

DIST_NAME = "airflow-ray-ml"
VERSION = "0.1.0"
# The import packages the wheel installs at the top of site-packages: namespaced names only, no
# top-level `operators` (a name teams use for their own code).
SHIPPED_TOP_LEVEL = {"airflow_ray_ml", "airflow_ray_ml_stages"}
AIRFLOW_PACKAGE = "airflow_ray_ml"
AIRFLOW_FOLDER = "operators"  # the Astro-style project's folder that AIRFLOW_PACKAGE installs from
PLUGIN_NAME = "ray_ml"
CONN_TYPE = "ray_ml"  # not "ray": the deprecated Ray provider's type
PLUGIN_CLASS = f"{AIRFLOW_PACKAGE}.plugins.ray_ml.RayMLPlugin"
CONN_FIELDS = {"dashboard_url", "auth_token", "verify_tls", "serve_url", "artifact_root", "storage_conn_id",
               "allowed_sources", "retries", "retry_max_wait_s"}
CONSTRAINTS = ROOT / "constraints.txt"
# The DAG file a team adds to enable the rollback DAG; the DAGs folder holds nothing else.
ROLLBACK_DAG_FILE = "dags/ray_serve_rollback.py"
ROLLBACK_DAG_ID = "ray_serve_rollback"
# pip's words when it could not connect (it retries, warning each time), and when it then found no
# release to install.
_UNREACHABLE = ("NewConnectionError", "NameResolutionError", "Failed to establish a new connection",
                "Temporary failure in name resolution", "Network is unreachable", "ConnectTimeoutError",
                "ProxyError")
_NOT_FOUND = ("No matching distribution found", "Could not find a version that satisfies",
              "no matching distributions available", "ResolutionImpossible")


def _skip_if_unreachable(output: str, what: str) -> None:
    """Skip when pip failed because it could reach no index that has the packages it needs."""
    text = " ".join(output.split())  # build wraps pip's lines
    if any(word in text for word in _UNREACHABLE) and any(word in text for word in _NOT_FOUND):
        pytest.skip(f"the package registry is unreachable and pip's cache cannot satisfy {what}:\n{output[-1500:]}")


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment less what the test set-up points at the checkout.

    Without ``PYTHONDONTWRITEBYTECODE`` (which some machines set): the fresh venv's
    first processes cache the bytecode of what they import, as an installed environment does (pip
    installs it with ``--no-compile``); with it, every Airflow command there compiled Airflow again."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("AIRFLOW", "RAYML_", "VIRTUAL_ENV"))
           and name not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    return {**env, **extra}


def _run(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> str:
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def _pip_install(python: Path, *args: str, cwd: Path, env: dict[str, str]) -> None:
    """Install into the environment of ``python`` with this environment's pip."""
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check", "--quiet",
            "--no-compile", "-c", str(CONSTRAINTS), *args]
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if result.returncode == 0:
        return
    output = result.stdout + result.stderr
    _skip_if_unreachable(output, f"`pip install {' '.join(args)}`")
    pytest.fail(f"{' '.join(argv)} failed:\n{output[-4000:]}")


def _source_tree(dest: Path) -> Path:
    """A copy of the files git would commit from the checkout (tracked and untracked, not ignored).

    Built in place, setuptools would also pack whatever a stale ``*.egg-info/SOURCES.txt`` of an
    earlier build lists, hiding a file the packaging config no longer includes.
    """
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from the checkout; the build backend at its tested version."""
    outdir = tmp_path_factory.mktemp("dist")
    source = _source_tree(tmp_path_factory.mktemp("source"))
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(source)],
                            env=_clean_env(), cwd=outdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = outdir.glob("*.tar.gz")
    (wheel,) = outdir.glob("*.whl")
    return {"source": source, "sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> dict:
    """A fresh virtual environment with the wheel and Airflow installed, and an empty Airflow home."""
    base = tmp_path_factory.mktemp("wheel-install")
    venv = base / "venv"
    env = _clean_env()
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, cwd=base, timeout=120)
    python = venv / "bin" / "python"
    _pip_install(python, str(dists["wheel"]), cwd=base, env=env)
    print(f"\nfresh venv with the wheel and Airflow: {time.monotonic() - started:.0f} s")
    for folder in ("home", "plugins", "dags"):
        (base / folder).mkdir()
    shutil.copy2(dists["source"] / ROLLBACK_DAG_FILE, base / "dags")
    airflow_env = _clean_env(
        AIRFLOW_HOME=str(base / "home"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(base / "plugins"),
        AIRFLOW__CORE__DAGS_FOLDER=str(base / "dags"),
        RAY_USAGE_STATS_ENABLED="0",
    )
    return {"venv": venv, "python": python, "env": airflow_env, "cwd": base}


def _airflow(installed: dict, *args: str):
    out = _run([str(installed["venv"] / "bin" / "airflow"), *args],
               env=installed["env"], cwd=installed["cwd"], timeout=300)
    return [] if out.strip() == "No plugins loaded" else json.loads(out)  # `airflow plugins` with none


def _python(installed: dict, code: str):
    """Run ``code`` with the venv's Python (cwd outside the checkout) and return what it prints as JSON."""
    out = _run([str(installed["python"]), "-c", code], env=installed["env"], cwd=installed["cwd"], timeout=300)
    return json.loads(out.strip().splitlines()[-1])


# -- what the build makes ------------------------------------------------------------------------


def _package_data(tree: Path) -> set[str]:
    """The non-Python files the packages carry, as paths in the source tree."""
    files = [*tree.glob(f"{AIRFLOW_FOLDER}/plugins/templates/*.html"),
             tree / AIRFLOW_FOLDER / "py.typed", tree / "include" / "airflow_ray_ml_stages" / "py.typed"]
    return {str(path.relative_to(tree)) for path in files}


def test_sdist_carries_license_readme_docs_and_package_data(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        members = {member.name.split("/", 1)[1]: member for member in sdist.getmembers() if "/" in member.name}
        license_text = sdist.extractfile(members["LICENSE"]).read().decode()
    source = dists["source"]
    docs = {str(path.relative_to(source)) for path in (source / "docs").rglob("*") if path.is_file()}
    assert docs and docs <= members.keys(), sorted(docs - members.keys())
    wanted = {"LICENSE", "README.md", "pyproject.toml"} | _package_data(source)
    assert wanted <= members.keys(), sorted(wanted - members.keys())
    assert license_text == (source / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_wheel_ships_exactly_its_packages_with_their_data_and_metadata(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        (record,) = [name for name in names if name.endswith(".dist-info/RECORD")]
        info_dir = record.rsplit("/", 1)[0]
        paths = [line.split(",")[0] for line in wheel.read(record).decode().splitlines() if line]
        metadata = wheel.read(f"{info_dir}/METADATA").decode()
        entry_points = wheel.read(f"{info_dir}/entry_points.txt").decode()
    assert set(paths) == set(names)
    top_level = {path.split("/")[0].removesuffix(".py") for path in paths
                 if not path.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level == SHIPPED_TOP_LEVEL
    # where each source file lands: include/<pkg>/... -> <pkg>/..., operators/... -> airflow_ray_ml/...
    in_wheel = {re.sub(f"^{AIRFLOW_FOLDER}/", f"{AIRFLOW_PACKAGE}/", path.removeprefix("include/"))
                for path in _package_data(dists["source"])}
    assert in_wheel <= set(paths), sorted(in_wheel - set(paths))
    # the development tool (a local Ray cluster, Serve's HAProxy wrapper) stays in scripts/
    assert [path for path in paths if path.endswith(("localcluster.py", "haproxy_loopback.sh"))] == []
    assert f"{info_dir}/licenses/LICENSE" in paths
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert f"Name: {DIST_NAME}" in headers and f"Version: {VERSION}" in headers
    assert "License-Expression: Apache-2.0" in headers
    for classifier in ("Framework :: Apache Airflow", "Framework :: Apache Airflow :: Provider",
                       "Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.12"):
        assert f"Classifier: {classifier}" in headers
    assert {"Homepage", "Documentation", "Issues"} <= {
        line.split(": ", 1)[1].split(",")[0] for line in headers if line.startswith("Project-URL: ")}
    assert f"provider_info = {AIRFLOW_PACKAGE}:get_provider_info" in entry_points
    module, _, cls = PLUGIN_CLASS.rpartition(".")
    assert f"{PLUGIN_NAME} = {module}:{cls}" in entry_points


# -- what the installed wheel gives Airflow ------------------------------------------------------


def test_the_packages_import_from_the_fresh_venv_with_their_data(installed):
    found = _python(installed, f"""
import json, {AIRFLOW_PACKAGE}, airflow_ray_ml_stages
from importlib.resources import files
from {AIRFLOW_PACKAGE}.plugins.ray_ml import _TEMPLATES
_TEMPLATES.get_template("ray_ml.html")
print(json.dumps({{"files": [{AIRFLOW_PACKAGE}.__file__, airflow_ray_ml_stages.__file__],
                  "typed": [(files(p) / "py.typed").is_file() for p in ("{AIRFLOW_PACKAGE}", "airflow_ray_ml_stages")]}}))
""")
    site = str(installed["venv"])
    assert all(path.startswith(site) for path in found["files"]), found["files"]  # not the checkout
    assert found["typed"] == [True, True]


def test_airflow_lists_the_provider(installed):
    providers = {p["package_name"]: p for p in _airflow(installed, "providers", "list", "-o", "json")}
    assert DIST_NAME in providers, sorted(providers)
    assert providers[DIST_NAME]["version"] == VERSION


def test_the_ray_ml_connection_type_and_its_fields_are_in_the_hook_metadata(installed):
    found = _python(installed, f"""
import json
from airflow.providers_manager import ProvidersManager
pm = ProvidersManager()
hook = pm.hooks.get("{CONN_TYPE}")
widgets = {{name: {{"field": w.field_name, "package": w.package_name, "sensitive": w.is_sensitive,
                    "title": w.field["schema"].get("title")}}
           for name, w in pm.connection_form_widgets.items() if name.startswith("extra__{CONN_TYPE}__")}}
print(json.dumps({{"hook": None if hook is None else {{"class": hook.hook_class_name, "package": hook.package_name,
                   "name": hook.hook_name, "type": hook.connection_type}},
                  "widgets": widgets, "behaviour": pm.field_behaviours.get("{CONN_TYPE}"),
                  "ray_type": "ray" in pm.hooks}}))
""")
    assert found["hook"] == {"class": f"{AIRFLOW_PACKAGE}.hooks.ray.RayHook", "package": DIST_NAME,
                             "name": "Ray ML", "type": CONN_TYPE}
    assert not found["ray_type"]  # the deprecated provider's type is left to it
    widgets = found["widgets"]
    assert {w["field"] for w in widgets.values()} == CONN_FIELDS
    assert all(w["package"] == DIST_NAME and w["title"] for w in widgets.values())
    assert [w["field"] for w in widgets.values() if w["sensitive"]] == ["auth_token"]
    assert "extra" in found["behaviour"]["hidden_fields"]


def test_task_ray_is_a_taskflow_decorator_of_the_installed_provider(installed):
    found = _python(installed, """
import json
from airflow.sdk import task
print(json.dumps(f"{task.ray.__module__}.{task.ray.__qualname__}"))
""")
    assert found == f"{AIRFLOW_PACKAGE}.decorators.ray.ray_task"


def test_the_page_plugin_loads_from_the_installed_package_alone(installed):
    assert not any(Path(installed["env"]["AIRFLOW__CORE__PLUGINS_FOLDER"]).iterdir())
    plugins = {p["name"]: p for p in _airflow(installed, "plugins", "-o", "json")}
    assert PLUGIN_NAME in plugins, sorted(plugins)
    plugin = plugins[PLUGIN_NAME]
    assert plugin["source"].startswith(f"{DIST_NAME}=={VERSION}: EntryPoint(name='{PLUGIN_NAME}'"), plugin["source"]
    assert [app["url_prefix"] for app in plugin["fastapi_apps"]] == ["/ray-ml"]
    assert [view["url_route"] for view in plugin["external_views"]] == ["ray-ml"]
    # The entry point is the one registration: the provider metadata declares no plugin (Airflow
    # would load it too with lazy_discover_providers = False), and loading raised no import error.
    found = _python(installed, """
import json
from airflow import plugins_manager
from airflow.providers_manager import ProvidersManager
print(json.dumps({"declared": [[p.name, p.plugin_class, p.provider_name] for p in ProvidersManager().plugins],
                  "errors": plugins_manager.get_import_errors()}))
""")
    # (other providers, such as OpenLineage, declare their own)
    assert [p for p in found["declared"] if p[2] == DIST_NAME] == []
    assert found["errors"] == {}


def test_the_rollback_dag_from_its_one_call_file_lists_and_the_pages_button_triggers_it(installed, tmp_path):
    """The DAGs folder holds only the one-call file: Airflow lists the DAG, and the page's action
    route (what the Pin button posts) refuses while the DAG is not in Airflow, then starts a run of it."""
    from airflow_ray_ml.serve_history import config_uri, serving_dir

    dags_folder = Path(installed["env"]["AIRFLOW__CORE__DAGS_FOLDER"])
    assert [path.name for path in dags_folder.iterdir()] == [Path(ROLLBACK_DAG_FILE).name]
    airflow = str(installed["venv"] / "bin" / "airflow")
    _run([airflow, "db", "migrate"], env=installed["env"], cwd=installed["cwd"], timeout=300)
    # A pinned version needs only the config its promotion recorded, and Serve's state (none live).
    app, version, artifact_root = "wine-quality", "xgboost-pinned", tmp_path / "artifacts"
    config = Path(config_uri(serving_dir(str(artifact_root), app), version))
    config.parent.mkdir(parents=True)
    config.write_text("{}")
    with FakeJobsApi(token="page-token") as dashboard:
        env = {**installed["env"], "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
               "AIRFLOW_CONN_RAY_DEFAULT": json.dumps({"conn_type": CONN_TYPE, "extra": {
                   "dashboard_url": dashboard.url, "auth_token": "page-token", "artifact_root": str(artifact_root)}})}
        out = _run([str(installed["python"]), "-c", f"""
import json, subprocess, sys
from fastapi.testclient import TestClient
from airflow.api_fastapi.app import create_app
from airflow.models.dagrun import DagRun
from airflow.models.errors import ParseImportError
from airflow.utils.session import create_session

client = TestClient(create_app())
def pin():
    response = client.post("/ray-ml/apps/{app}/actions", json={{"version": "{version}"}},
                           headers={{"X-Ray-ML-Action": "1"}})
    return {{"status": response.status_code, "body": response.json()}}
before = pin()
subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize"], check=True, stdout=subprocess.DEVNULL)
after = pin()
with create_session() as session:
    runs = [{{"dag_id": r.dag_id, "run_id": r.run_id, "conf": r.conf}} for r in session.query(DagRun)]
    errors = [e.filename for e in session.query(ParseImportError)]
print(json.dumps({{"before": before, "after": after, "runs": runs, "errors": errors}}))
"""], env=env, cwd=installed["cwd"], timeout=300)
        asked_serve = dashboard.count("GET", "/api/serve/applications/")
    found = json.loads(out.strip().splitlines()[-1])
    # (the CLI prints Python warnings, such as a missing graphviz, on stdout before the JSON)
    listed = json.loads(_run([airflow, "dags", "list", "-o", "json"], env=installed["env"], cwd=installed["cwd"],
                             timeout=300).strip().splitlines()[-1])
    assert [dag["dag_id"] for dag in listed] == [ROLLBACK_DAG_ID]
    assert found["errors"] == []
    assert found["before"]["status"] == 404, found["before"]
    assert f"serve_rollback_dag({ROLLBACK_DAG_ID!r})" in found["before"]["body"]["detail"]
    assert found["after"]["status"] == 201, found["after"]
    started = found["after"]["body"]
    assert started["dag_id"] == ROLLBACK_DAG_ID and started["version"] == version
    (run,) = found["runs"]
    assert run["run_id"] == started["run_id"] and run["conf"]["app_name"] == app and run["conf"]["version"] == version
    assert asked_serve == 1  # the refused request never asked Ray
