"""`make test-lowest`'s two helpers: the constraints it installs with, and the check of what it installed.

uv's lowest-direct resolution puts each direct dependency at its lower bound; every other package
is held at the version the suite is tested with (constraints.txt), as a team's install would hold
Airflow's own dependencies with Airflow's constraints file, less what constraints-lowest.txt sets
instead (an indirect dependency whose tested version breaks an old direct one). A bound is not the
one the tests ran on when another package asks for more: the check names it.

    .venv/bin/python scripts/lowest_bounds.py --constraints > FILE   the tested set less the bounded
    .venv-lowest/bin/python scripts/lowest_bounds.py                  each bound beside what is installed
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Version]:
    """Each runtime dependency's ``>=`` bound (the `dependencies` list, not the extras)."""
    bounds = {}
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        for specifier in requirement.specifier:
            if specifier.operator == ">=":
                bounds[requirement.name] = Version(specifier.version)
    return bounds


def tested_constraints(tested: Path = ROOT / "constraints.txt",
                       overrides: Path = ROOT / "constraints-lowest.txt") -> list[str]:
    """constraints.txt's pins less the runtime dependencies, Airflow's own distributions (pinned by
    the Airflow release) and what constraints-lowest.txt sets."""
    def name(line: str) -> str:
        return canonicalize_name(Requirement(line).name)

    def pins(path: Path) -> list[str]:
        return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]

    left_out = {canonicalize_name(dependency) for dependency in lower_bounds()} | {name(line) for line in pins(overrides)}
    return [line for line in pins(tested) if name(line) not in left_out and not name(line).startswith("apache-airflow")]


def off_bounds(bounds: dict[str, Version]) -> dict[str, str]:
    """The dependencies not installed at their bound, with what is installed instead."""
    found = {}
    for name, bound in bounds.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = "not installed"
        if installed == "not installed" or Version(installed) != bound:
            found[name] = installed
    return found


def main() -> int:
    if sys.argv[1:] == ["--constraints"]:
        print("\n".join(tested_constraints()))
        return 0
    bounds = lower_bounds()
    off = off_bounds(bounds)
    for name, bound in bounds.items():
        print(f"{name:40} >={bound!s:10} installed {off.get(name, bound)}")
    if off:
        print(f"not at their lower bound: {sorted(off)}; another package requires more: raise the bound in "
              "pyproject.toml to what is installed (and say why beside it)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
