"""Run one ``@task.ray`` function in its Ray job: ``python -m airflow_ray_ml_stages.task_function``.

The Airflow side (``airflow_ray_ml.decorators.ray``) sends the function as source, never pickled: a
module of its own, uploaded as a package of the job's ``py_modules``, holding the function's
``def`` and nothing else. Its arguments travel as JSON on the command line, as a stage's spec does. This
module imports that module, calls the function with the arguments, and publishes the JSON return
value as the job's manifest (``return_value``), which the operator returns as the task's XCom. An
exception from the function is printed with its traceback (so it reaches the task log) and becomes
the failed manifest's error; the task's ``retries`` decide whether it runs again. A return value
that is not JSON fails without a retry: another try would return the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
import time
import traceback
from typing import Any, Sequence

from airflow_ray_ml_stages.constants import ARTIFACT_DIR_ENV
from airflow_ray_ml_stages.errors import RayMLError
from airflow_ray_ml_stages.spec_base import JsonDataclass
from airflow_ray_ml_stages.stage import build_manifest, main_of, publish_manifest

log = logging.getLogger("airflow_ray_ml_stages")

STAGE = "task_function"
"""The manifest's ``stage``: what wrote it."""


class TaskFunctionError(RayMLError, TypeError):
    """The function's arguments or return value cannot travel as JSON, or its module is missing."""


@dataclasses.dataclass
class TaskReturn(JsonDataclass):
    """What a ``@task.ray`` function's manifest adds to the common fields."""

    return_value: Any


RETURN_KEY = "return_value"
"""The manifest key holding the function's return value (:class:`TaskReturn`'s field)."""


def json_problem(value: Any, where: str) -> str | None:
    """What keeps ``value`` from travelling as JSON unchanged, naming where in it; None if nothing does.

    Tuples pass (they arrive as lists); dict keys must be text, since JSON would turn other keys into text.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next((problem for index, item in enumerate(value)
                     if (problem := json_problem(item, f"{where}[{index}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r}, a {type(key).__name__}, where JSON takes only text keys"
            problem = json_problem(item, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON"


def read_arguments(text: str) -> dict[str, Any]:
    """The call's arguments from their JSON: ``{"args": [...], "kwargs": {...}}``."""
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as err:
        raise TaskFunctionError(f"the arguments are not JSON ({err})") from None
    if not (isinstance(arguments, dict) and isinstance(arguments.get("args", []), list)
            and isinstance(arguments.get("kwargs", {}), dict)):
        raise TaskFunctionError('the arguments must be {"args": [...], "kwargs": {...}}')
    return arguments


def call(module_name: str, function_name: str, arguments: dict[str, Any]) -> Any:
    """Import the function's module, call the function with ``arguments`` and return its JSON value."""
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as err:
        raise TaskFunctionError(f"the function's module {module_name} did not reach the job ({err}); is "
                                "py_modules of the job's runtime_env overridden?") from None
    value = function(*arguments.get("args", []), **arguments.get("kwargs", {}))
    problem = json_problem(value, f"the return value of {function_name}()")
    if problem:
        raise TaskFunctionError(f"{problem}: return numbers, text, lists or dicts; write larger results "
                                f"under ${ARTIFACT_DIR_ENV} and return their paths")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    parser = argparse.ArgumentParser(prog=f"python -m airflow_ray_ml_stages.{STAGE}")
    parser.add_argument("--module", required=True, help="the module holding the function's source")
    parser.add_argument("--function", required=True, help="the function's name in it")
    parser.add_argument("--arguments", default='{"args": [], "kwargs": {}}',
                        help='the call\'s arguments: {"args": [...], "kwargs": {...}} in JSON')
    args = parser.parse_args(argv)
    started = time.time()
    artifact_dir = os.environ.get(ARTIFACT_DIR_ENV, "")
    try:
        arguments = read_arguments(args.arguments)
        log.info("calling %s() as a Ray job", args.function)
        value = call(args.module, args.function, arguments)
    except Exception as err:  # every failure leaves a failed manifest, with whether a retry can help
        if isinstance(err, RayMLError):
            log.error("%s() failed: %s", args.function, err)
        else:  # the function's own error: its traceback is what a person reads in the task log
            traceback.print_exc(file=sys.stdout)
        message = f"{type(err).__name__}: {err}"
        retryable = err.retryable if isinstance(err, RayMLError) else True
        publish_manifest(build_manifest(STAGE, artifact_dir, started, None, message, retryable))
        return 1
    publish_manifest(build_manifest(STAGE, artifact_dir, started, TaskReturn(value), None))
    return 0


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
