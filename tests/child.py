"""A Python child process whose result comes back in a file of its own, never on its stdout.

A child's stdout is shared with every thread that writes to it: Airflow's OpenLineage adapter once
wrote its log line onto the line that carried a test's ``DAG_RUN {...}`` result, and the parent's
``json.loads`` failed with "Extra data". The child's code calls ``report(value)`` (defined for it)
with a JSON-able value; the parent reads that value from the file once the child has exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

RESULT_ENV = "RAYML_CHILD_RESULT"
_MISSING = object()

# defined before the child's own code; writes the file whole, then renames it, so a half-written
# result is never read
_REPORT = f"""
def report(value):
    import json as _json, os as _os
    _path = _os.environ[{RESULT_ENV!r}]
    with open(_path + ".part", "w") as _file:
        _json.dump(value, _file)
    _os.replace(_path + ".part", _path)
"""


@dataclass
class Child:
    returncode: int
    stdout: str
    stderr: str
    reported: bool  # whether it called report()
    result: Any  # what report() was given; None when it was never called

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def result_file() -> str:
    """A fresh path for a child's result (a program of its own, such as a bench's script, writes it)."""
    handle, path = tempfile.mkstemp(prefix="rayml-child-", suffix=".json")
    os.close(handle)
    os.unlink(path)
    return path


def _take(path: str) -> Any:
    """The JSON a child wrote to ``path`` (the file then removed); ``_MISSING`` when it wrote none."""
    try:
        with open(path) as file:
            return json.load(file)
    except FileNotFoundError:
        return _MISSING
    finally:
        for leftover in (path, path + ".part"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def read_result(path: str) -> Any:
    """The JSON a program of its own wrote to ``path`` (the file then removed)."""
    result = _take(path)
    if result is _MISSING:
        raise RuntimeError(f"the child wrote no result to {path}")
    return result


def run_python(code: str, *args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
               timeout: float | None = None, check: bool = True) -> Child:
    """``python -c code args...``; its ``report(value)`` comes back as ``result``. With ``check`` (the
    default) a child that failed, or exited without reporting, fails the calling test with its output."""
    path = result_file()
    environment = dict(os.environ if env is None else env)
    environment[RESULT_ENV] = path
    try:
        done = subprocess.run([sys.executable, "-c", _REPORT + code, *args], env=environment, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        result = _take(path)
    reported = result is not _MISSING
    child = Child(done.returncode, done.stdout, done.stderr, reported, result if reported else None)
    if check:
        assert done.returncode == 0 and child.reported, \
            f"child exited {done.returncode}{'' if child.reported else ' without a result'}:\n{child.output[-4000:]}"
    return child
