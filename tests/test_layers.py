"""The two layers stay apart, and the Ray-side package stays in layers of its own.

airflow_ray_ml_stages never imports airflow; its modules import each other without cycles; no module uses another
module's private names; the modules the Airflow side and the stage jobs import keep the heavy
libraries out of import time.
"""

from __future__ import annotations

import ast
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import airflow_ray_ml_stages
from tests.child import run_python
from tests.conftest import ROOT, requires_ml_extra

RAYML_DIR = Path(airflow_ray_ml_stages.__file__).parent
# This checkout's airflow_ray_ml_stages, not whichever one the interpreter has installed (an editable install of another).
CHECKOUT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
OUTSIDE_DIRS = ("operators", "dags", "plugins", "bench", "scripts", "tests")
"""Code outside the package that imports it: it may use only airflow_ray_ml_stages's public names too."""


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


@requires_ml_extra
def test_importing_every_rayml_module_loads_no_airflow():
    modules = [info.name for info in pkgutil.walk_packages(airflow_ray_ml_stages.__path__, "airflow_ray_ml_stages.")]
    assert "airflow_ray_ml_stages.stage" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "print(loaded); sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stdout + result.stderr


def test_layer_check_catches_an_airflow_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from airflow.sdk import DAG\nimport os\n")
    assert "airflow" in _imported_roots(bad)


LIGHTNING_ROOTS = {"lightning", "pytorch_lightning"}


def test_lightning_is_imported_only_through_the_lightning_package_module():
    """Every Lightning class a Trainer gets comes from the package Ray's Lightning utilities chose
    (models/lightning_package.py decides it); a direct import of either package could mix the two."""
    chooser = RAYML_DIR / "models" / "lightning_package.py"
    sources = [*RAYML_DIR.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    offenders = sorted(str(path.relative_to(ROOT)) for path in sources
                       if path != chooser and _imported_roots(path) & LIGHTNING_ROOTS)
    assert offenders == []
    assert _imported_roots(chooser) & LIGHTNING_ROOTS == LIGHTNING_ROOTS


# -- the package's own layers --------------------------------------------------------------------

def _modules(package_dir: Path, name: str | None = None) -> dict[str, Path]:
    """Every module of a package (subpackages included) by dotted name, from its files; ``name``: the
    package's import name where its folder is named otherwise (operators/ installs as airflow_ray_ml)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [name or package_dir.name, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _split(dotted: str, modules: dict[str, Path]) -> tuple[str | None, list[str]]:
    """The module a dotted name lies in (its longest prefix that is a module) and the rest of it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end]), parts[end:]
    return None, parts


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _uses(path: Path, module: str | None, modules: dict[str, Path]) -> tuple[set[str], set[tuple[int, str]]]:
    """The package's modules that ``path`` imports, and the other modules' private names it uses (by line).

    Every import counts, at module level or inside a function: a lazy import is a dependency too.
    Private names are found in ``from m import _x``, in attributes reached from an imported module
    (``m._x``, ``pkg.m._x``) and in strings naming them (``"pkg.m._x"``, as monkeypatch takes).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    root = next(iter(modules)).split(".")[0]
    imported, private, bound = set(), set(), {}

    def use(dotted: str, where: int) -> None:
        owner, rest = _split(dotted, modules)
        if owner is not None and owner != module and rest and _is_private(rest[0]):
            private.add((where, f"{owner}.{rest[0]}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == root:
                    imported.add(_split(alias.name, modules)[0] or alias.name)
                    bound[alias.asname or root] = alias.name if alias.asname else root
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level and module is None:  # outside the package: relative to something else
                continue
            if node.level:  # relative: from the importing module's package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                source = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            if source.split(".")[0] != root:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:
                    imported.add(full)
                    bound[alias.asname or alias.name] = full
                else:
                    imported.add(_split(source, modules)[0] or source)
                    use(full, node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            base = node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                use(".".join([bound[base.id], *chain]), node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(rf"{root}(\.[A-Za-z_]\w*)+", node.value):
                use(node.value, node.lineno)
    imported.discard(module)
    return imported, private


def _import_graph(package_dir: Path, name: str | None = None) -> dict[str, set[str]]:
    modules = _modules(package_dir, name)
    return {name: _uses(path, name, modules)[0] & set(modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of the graph (``[a, b, a]``), or [] when it has none."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*stack[stack.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def _private_uses(package_dir: Path, outside: list[Path] = ()) -> list[str]:
    """``<file>:<line> uses <module>.<name>`` for each private name used outside its module."""
    modules = _modules(package_dir)
    files = [(path, name, package_dir.parent) for name, path in modules.items()]
    files += [(path, None, folder.parent) for folder in outside for path in sorted(folder.rglob("*.py"))]
    return [f"{path.relative_to(base)}:{line} uses {name}"
            for path, module, base in files for line, name in sorted(_uses(path, module, modules)[1])]


def test_rayml_modules_import_each_other_without_cycles():
    graph = _import_graph(RAYML_DIR)
    assert {"airflow_ray_ml_stages.data.stage", "airflow_ray_ml_stages.train.stage", "airflow_ray_ml_stages.specs"} <= set(graph)
    assert "airflow_ray_ml_stages.data.engines" in graph["airflow_ray_ml_stages.data.stage"]  # the graph sees the package's imports
    assert _cycle(graph) == [], " -> ".join(_cycle(graph))


def test_provider_modules_import_each_other_without_cycles():
    """The Airflow side's operators, hooks, triggers and links (the UI plugins aside) form layers too:
    the Serve operators' modules (serve_apps, serve_config, serve_history, serve_gate,
    serve_application) import downwards only."""
    graph = _import_graph(ROOT / "operators", "airflow_ray_ml")
    plugins = {name for name in graph if name.startswith("airflow_ray_ml.plugins")}
    provider = {name: targets - plugins for name, targets in graph.items() if name not in plugins}
    assert {"airflow_ray_ml.serve_gate", "airflow_ray_ml.hooks.ray"} <= graph["airflow_ray_ml.ray_serve"]
    assert _cycle(provider) == [], " -> ".join(_cycle(provider))


def test_no_rayml_module_uses_another_modules_private_names():
    """A name another module needs is public (or the code lives where it is used); the same goes for
    the code outside the package: operators, DAGs, plugins, bench, scripts and tests."""
    assert _private_uses(RAYML_DIR, [ROOT / folder for folder in OUTSIDE_DIRS]) == []


def test_layer_checks_catch_a_cycle_and_a_private_use(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import helper\n\ndef _private():\n    return 1\n")
    (package / "b.py").write_text("def helper():\n    from pkg import a\n    return a._private()\n")
    (package / "sub" / "c.py").write_text("import pkg.a as alias\nfrom . import d\nfrom pkg.a import _private\n"
                                          "PATCH = 'pkg.b._hidden'\nvalue = alias._private\n")
    (package / "sub" / "d.py").write_text("from ..a import helper\n")
    graph = _import_graph(package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.sub": set(),
                     "pkg.sub.c": {"pkg.a", "pkg.sub.d"}, "pkg.sub.d": {"pkg.a"}}
    assert _cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    del graph["pkg.b"], graph["pkg.a"]
    assert _cycle({name: targets - {"pkg.a", "pkg.b"} for name, targets in graph.items()}) == []
    assert _private_uses(package) == ["pkg/b.py:3 uses pkg.a._private", "pkg/sub/c.py:3 uses pkg.a._private",
                                      "pkg/sub/c.py:4 uses pkg.b._hidden", "pkg/sub/c.py:5 uses pkg.a._private"]


# -- what importing costs ------------------------------------------------------------------------

HEAVY = ("pandas", "pyarrow.compute", "torch", "lightning", "pytorch_lightning", "xgboost", "ray", "matplotlib")


def _loaded_after_import(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    code = (f"import importlib, sys\nfor name in {modules!r}: importlib.import_module(name)\n"
            f"report(sorted(m for m in {list(watched)!r} if m in sys.modules))\n")
    return run_python(code, env=CHECKOUT_ENV).result


def test_the_stage_entry_modules_import_no_heavy_library():
    """What ``python -m airflow_ray_ml_stages.<stage>`` imports before the stage decides what it needs: each stage
    imports pandas, torch, xgboost, Ray or matplotlib only on the path that uses them."""
    stages = ["airflow_ray_ml_stages.data.stage", "airflow_ray_ml_stages.train.stage", "airflow_ray_ml_stages.tune", "airflow_ray_ml_stages.score", "airflow_ray_ml_stages.generate",
              "airflow_ray_ml_stages.probe"]
    assert _loaded_after_import(stages, HEAVY) == []


def test_the_specs_import_neither_numpy_nor_pyarrow():
    """airflow_ray_ml_stages.specs and airflow_ray_ml_stages.search_space (what the Airflow side builds specs with) stay light,
    though airflow_ray_ml_stages.specs imports airflow_ray_ml_stages.train.config from the train package."""
    assert _loaded_after_import(["airflow_ray_ml_stages.specs", "airflow_ray_ml_stages.search_space"], ("numpy", "pyarrow", *HEAVY)) == []
