"""Processes whose import system cannot see some installed packages, for tests of a path without them.

:func:`hiding_env` writes a ``sitecustomize.py`` that wraps every finder on ``sys.meta_path`` so
that none finds the named top-level packages (or anything under them): importing one raises
``ModuleNotFoundError`` and ``importlib.util.find_spec`` answers None, as without them. Python
imports ``sitecustomize`` at start-up from ``PYTHONPATH``, so every process started with the
returned environment, and every process those start (a Ray head's raylet, its workers, jobs and
their actors), runs without the packages.
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''\
import sys


class HidingFinder:
    """Wraps a meta path finder: it finds nothing of {names!r}, as if they were not installed."""

    hidden = {names!r}

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.hidden:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, name)


sys.meta_path[:] = [HidingFinder(finder) for finder in sys.meta_path]
'''


def hiding_env(names: list[str], directory: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``PYTHONPATH`` starting at a ``sitecustomize`` hiding ``names``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE.format(names=sorted(names)))
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))
    return env
