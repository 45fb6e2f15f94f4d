"""Processes whose import system cannot see some installed packages, for tests of a path without them.

:func:`hiding_env` writes a ``sitecustomize.py`` that puts a finder first on ``sys.meta_path``; the
finder refuses the named top-level packages (and everything under them) with ``ModuleNotFoundError``,
as an environment without them would. Python imports ``sitecustomize`` at start-up from
``PYTHONPATH``, so every process started with the returned environment, and every process those
start (a Ray head's raylet, its workers, jobs and their actors), runs without the packages.
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''\
import sys


class HiddenPackages:
    """Refuses {names!r}: as if they were not installed."""

    hidden = {names!r}

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.hidden:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, HiddenPackages())
'''


def hiding_env(names: list[str], directory: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``PYTHONPATH`` starting at a ``sitecustomize`` hiding ``names``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE.format(names=sorted(names)))
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return env
