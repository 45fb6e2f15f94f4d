"""The "Ray ML" plugin registers once: no plugin import error where `make run` starts Airflow.

The checkout is first given the metadata that `make install`'s editable build leaves behind (an
``airflow_ray_ml.egg-info`` in ``include/``), so Airflow is asked exactly as on a freshly installed
checkout, in the environment ``scripts/stack.py`` starts ``airflow standalone`` with: through
Airflow's plugins manager, and through the REST API the home page's banner reads.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import requests

from tests.child import run_python
from tests.conftest import ROOT
from tests.plugins.api_server import running_api_server

_SPEC = importlib.util.spec_from_file_location("stack", ROOT / "scripts" / "stack.py")
stack = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stack)

PLUGIN_NAME = "ray_ml"
# What the home page's "Plugin Import Error" banner counts (GET /api/v2/plugins/importErrors reads it).
_LOAD_PLUGINS = """
from airflow import plugins_manager
if hasattr(plugins_manager, "_get_plugins"):
    plugins, errors = plugins_manager._get_plugins()
else:  # Airflow 3.1 keeps what it loaded in the module
    plugins_manager.ensure_plugins_loaded()
    plugins, errors = plugins_manager.plugins, plugins_manager.import_errors
report({"plugins": [[p.name, str(p.source), [getattr(l, "__name__", str(l)) for l in p.listeners]]
                     for p in plugins], "errors": errors})
"""


@pytest.fixture(scope="module")
def installed_checkout() -> None:
    """The checkout as `make install` leaves it: setuptools' egg-info of the editable build in include/.
    A venv without setuptools (`make test-lowest`'s, made by uv) had it left there by its own install's
    isolated build."""
    if importlib.util.find_spec("setuptools") is not None:
        subprocess.run([sys.executable, "-c",
                        "from setuptools import build_meta; build_meta.get_requires_for_build_editable()"],
                       cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert (ROOT / "include" / "airflow_ray_ml.egg-info" / "entry_points.txt").is_file()


def _plugins(tmp_path, **settings: str) -> dict:
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**stack.airflow_env(), "AIRFLOW_HOME": str(tmp_path / "home"), **settings}
    return run_python(_LOAD_PLUGINS, env=env, cwd=tmp_path, timeout=300).result


def test_ray_ml_plugin_in_the_make_run_environment_registers_once_without_import_errors(installed_checkout, tmp_path):
    found = _plugins(tmp_path)
    assert found["errors"] == {}
    ours = [plugin for plugin in found["plugins"] if plugin[0] == PLUGIN_NAME]
    assert len(ours) == 1, found["plugins"]
    name, source, listeners = ours[0]
    assert f"EntryPoint(name='{PLUGIN_NAME}'" in source
    assert listeners == ["airflow_ray_ml.plugins.decision_notes"]  # the notes listener comes with it


def test_ray_ml_plugin_with_providers_discovered_eagerly_is_not_registered_twice(installed_checkout, tmp_path):
    found = _plugins(tmp_path, AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS="False")
    assert [plugin[0] for plugin in found["plugins"]].count(PLUGIN_NAME) == 1
    # (Airflow itself doubles other providers' plugins in this mode; ours is declared once)
    assert not [key for key, message in found["errors"].items() if PLUGIN_NAME in key or f"'{PLUGIN_NAME}'" in message]


@pytest.mark.integration
def test_ray_ml_plugin_import_errors_in_the_rest_api_of_a_make_run_environment_are_none(installed_checkout, airflow_db,
                                                                                      tmp_path):
    with running_api_server(tmp_path, PYTHONPATH=stack.airflow_env()["PYTHONPATH"],
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        errors = requests.get(f"{base}/api/v2/plugins/importErrors", timeout=30)
        plugins = requests.get(f"{base}/api/v2/plugins", params={"limit": 100}, timeout=30)
    assert errors.status_code == 200 and errors.json()["total_entries"] == 0, errors.text
    assert [plugin["name"] for plugin in plugins.json()["plugins"]].count(PLUGIN_NAME) == 1
