"""The two layers stay apart: the Ray-side package never imports airflow."""

from __future__ import annotations

import ast
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import rayml
from tests.conftest import ROOT

RAYML_DIR = Path(rayml.__file__).parent


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_rayml_sources_never_import_airflow_or_operators():
    offenders = {
        str(path.relative_to(RAYML_DIR)): sorted(_imported_roots(path) & {"airflow", "operators"})
        for path in RAYML_DIR.rglob("*.py")
    }
    assert {name: roots for name, roots in offenders.items() if roots} == {}


def test_importing_every_rayml_module_loads_no_airflow():
    modules = [info.name for info in pkgutil.walk_packages(rayml.__path__, "rayml.")]
    assert "rayml.stage" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "print(loaded); sys.exit(1 if loaded else 0)\n"
    )
    # This checkout's rayml, not whichever one the interpreter has installed (an editable install of another).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_layer_check_catches_an_airflow_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from airflow.sdk import DAG\nimport os\n")
    assert "airflow" in _imported_roots(bad)
