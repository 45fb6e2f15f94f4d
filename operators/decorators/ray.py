"""``@task.ray``: a Python function run as a Ray job, its JSON return value the task's XCom.

::

    from airflow.sdk import task

    @task.ray(runtime_env={"pip": ["scikit-learn"]}, entrypoint_num_cpus=1)
    def fit(rows: int, seed: int = 7) -> dict:
        from sklearn.datasets import make_regression      # imports go inside: the function runs alone
        ...
        return {"r2": 0.91}

    fit(rows=10_000)

The function travels without pickle: its source (the ``def`` alone, decorators cut off) becomes a
module of its own, uploaded with the job as a ``py_modules`` package, and its arguments travel as JSON
on the job's command line; ``python -m airflow_ray_ml_stages.task_function`` calls it on the
cluster. So the function must stand alone, and this module refuses at DAG-parse time what could
not: a lambda, a closure, a name from outside the function (a module-level import or constant),
another decorator beneath ``@task.ray``, a default that is not a literal, an ``async`` function or
a generator. Arguments and the return value must be JSON (tuples arrive as lists); an argument that
is not fails the task at once, before any job.

:class:`RayDecoratedOperator` is :class:`~airflow_ray_ml.ray_job.RayJobOperator` with the function
as its command, so it takes every argument RayJobOperator takes for a command (``runtime_env``,
``entrypoint_num_cpus`` and the other resources, ``deferrable``, ``job_timeout_s``, ...) and
behaves the same: one submission id per task run (a retry re-attaches to a running job), the job's
log streamed into the task log, and the job stopped when the task is killed.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import os
import shlex
import symtable
import tempfile
import textwrap
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Collection, Mapping, Sequence

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory

from airflow_ray_ml_stages.task_function import RETURN_KEY, STAGE, json_problem
from airflow_ray_ml.errors import RayJobFailedError, RayManifestError, RayStageError, RayTaskFunctionError
from airflow_ray_ml.job_status import Decision, RayJobStatus
from airflow_ray_ml.ray_job import RayJobOperator, last_lines, manifest_from_log

if TYPE_CHECKING:
    from airflow.sdk import Context

MODULE_PREFIX = "rayml_task_"
"""The function's module on the cluster is this and its name (``rayml_task_fit``): never a name
that shadows a module the function imports."""

MAX_ARGUMENTS_BYTES = 100_000
"""The most JSON the arguments may take: they travel on the job's command line, which the node's shell
gets as one argument of at most 128 KiB (Linux's MAX_ARG_STRLEN), with the command around them."""

FUTURE_ANNOTATIONS = "from __future__ import annotations  # its annotations need not import on the cluster\n\n"

# What a function of a command needs and the function replaces: the operator builds them itself.
_COMMAND_ARGUMENTS = ("stage", "spec", "entrypoint")


def _refuse(name: str, problem: str) -> RayTaskFunctionError:
    return RayTaskFunctionError(f"@task.ray function {name!r} {problem}")


def _outside_names(source: str, function_name: str) -> list[str]:
    """Names the function (and every scope inside it) reads from outside itself, builtins aside."""
    found: set[str] = set()
    tables = list(symtable.symtable(source, "<@task.ray>", "exec").get_children())
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        found.update(symbol.get_name() for symbol in table.get_symbols()
                     if symbol.is_global() and symbol.is_referenced())
    return sorted(found - set(dir(builtins)) - {function_name})


def task_function_source(function: Callable) -> str:
    """The function's ``def``, dedented and without its decorators: the module its job imports.

    Raises :class:`~airflow_ray_ml.errors.RayTaskFunctionError` naming what keeps the function from
    running alone on the cluster, and what to do instead.
    """
    name = getattr(function, "__name__", repr(function))
    if not inspect.isfunction(function):
        raise _refuse(name, f"is a {type(function).__name__}: decorate a function defined with def")
    if name == "<lambda>":
        raise _refuse(name, "is a lambda, whose source cannot be cut out of its line: define it with def")
    if hasattr(function, "__wrapped__"):
        raise _refuse(name, "is wrapped by another decorator, which would not travel to the cluster: put "
                            "@task.ray on the function itself, or call the other decorator's work inside it")
    if inspect.iscoroutinefunction(function) or inspect.isgeneratorfunction(function) or \
            inspect.isasyncgenfunction(function):
        raise _refuse(name, "is async or a generator: make it a plain function that returns its result")
    if function.__code__.co_freevars:
        raise _refuse(name, f"is a closure over {sorted(function.__code__.co_freevars)} of the function around "
                            "it, which stay behind in Airflow: pass them as arguments")
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError) as err:
        raise _refuse(name, f"has no source file to send ({err}): define it in a DAG file or a module") from None
    try:
        node = ast.parse(source).body[0]
    except SyntaxError as err:
        raise _refuse(name, f"cannot be read alone from its source ({err.msg}, line {err.lineno})") from None
    if not isinstance(node, ast.FunctionDef) or node.name != name:
        raise _refuse(name, "could not be found in its source: define it with def, on lines of its own")
    for default in (*node.args.defaults, *(value for value in node.args.kw_defaults if value is not None)):
        try:
            ast.literal_eval(default)
        except ValueError:
            raise _refuse(name, f"has the default {ast.unparse(default)!r}, which is computed where the function "
                                "is defined: give a literal (a number, text, None, a list or dict of them)") from None
    source = "".join(source.splitlines(keepends=True)[node.lineno - 1:node.end_lineno])
    outside = _outside_names(source, name)
    if outside:
        raise _refuse(name, f"uses {outside} from outside it, which stay behind in Airflow: the function runs "
                            "alone on the cluster, so import inside it what it needs and pass values as arguments")
    return source


class RayDecoratedOperator(DecoratedOperator, RayJobOperator):
    """Run the decorated function as a Ray job and return its JSON return value as the XCom.

    Takes RayJobOperator's arguments for a command (all but ``stage``, ``spec`` and
    ``entrypoint``, which the function replaces).

    :param python_callable: the function; it must stand alone (see :func:`task_function_source`).
    :param op_args: its positional arguments, JSON. (templated)
    :param op_kwargs: its keyword arguments, JSON. (templated)
    """

    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(field for field in RayJobOperator.template_fields if field not in _COMMAND_ARGUMENTS),
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {
        **DecoratedOperator.template_fields_renderers, **RayJobOperator.template_fields_renderers,
    }
    custom_operator_name = "@task.ray"

    def __init__(
        self,
        *,
        python_callable: Callable,
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        given = [argument for argument in _COMMAND_ARGUMENTS if argument in kwargs]
        if given:
            raise _refuse(getattr(python_callable, "__name__", "?"),
                          f"was given {given}: the function is the job's command; use RayJobOperator for those")
        self.function_source = task_function_source(python_callable)
        self.function_module = MODULE_PREFIX + python_callable.__name__
        super().__init__(
            python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs,
            entrypoint=f"python -m airflow_ray_ml_stages.{STAGE} --module {self.function_module} "
                       f"--function {python_callable.__name__}",
            **kwargs,
        )
        self._module_folder: str | None = None

    @property
    def function_name(self) -> str:
        return self.python_callable.__name__

    def call_arguments(self) -> dict[str, Any]:
        """The rendered arguments as they travel, checked: they bind to the function and are JSON."""
        try:
            inspect.signature(self.python_callable).bind(*self.op_args, **self.op_kwargs)
        except TypeError as err:
            raise _refuse(self.function_name, f"cannot be called with its arguments: {err} (the function gets the "
                                              "arguments it is called with, no Airflow context)") from None
        arguments = {"args": list(self.op_args), "kwargs": dict(self.op_kwargs)}
        problem = json_problem(arguments["args"], "args") or json_problem(arguments["kwargs"], "kwargs")
        if problem:
            raise _refuse(self.function_name, f"gets an argument that is not JSON: {problem}; pass numbers, text, "
                                              "lists or dicts (a path or URI for larger data)")
        size = len(json.dumps(arguments).encode())
        if size > MAX_ARGUMENTS_BYTES:
            raise _refuse(self.function_name, f"gets {size} bytes of arguments, more than a job's command line "
                                              f"carries ({MAX_ARGUMENTS_BYTES}): write the data to storage (such "
                                              "as the artifact root) and pass its path")
        return arguments

    def execute(self, context: Context) -> Any:
        self.call_arguments()  # before any job: arguments that cannot travel fail at once
        return super().execute(context)

    def job_entrypoint(self, spec: dict[str, Any] | None) -> str:
        arguments = json.dumps(self.call_arguments(), sort_keys=True)
        return f"{self.entrypoint} --arguments {shlex.quote(arguments)}"

    def job_runtime_env(self, artifact_dir: str | None = None) -> dict[str, Any]:
        runtime_env = super().job_runtime_env(artifact_dir)
        if self._module_folder:  # while submitting: the function's module travels with the job
            package = os.path.join(self._module_folder, self.function_module)
            runtime_env["py_modules"] = [*runtime_env.get("py_modules", []), package]
        return runtime_env

    def submit(self, context: Context, submission_id: str, spec: dict[str, Any] | None,
               artifact_dir: str) -> Decision:
        # a package of one __init__.py: Ray's job client uploads py_modules directories, not single files
        with tempfile.TemporaryDirectory(prefix="rayml-task-") as folder:
            os.mkdir(os.path.join(folder, self.function_module))
            with open(os.path.join(folder, self.function_module, "__init__.py"), "w", encoding="utf-8") as module:
                module.write(FUTURE_ANNOTATIONS + self.function_source)
            self._module_folder = folder
            try:
                return super().submit(context, submission_id, spec, artifact_dir)
            finally:
                self._module_folder = None

    def command_result(self, submission_id: str, status: RayJobStatus | None, logs: str) -> Any:
        """The function's return value, from the manifest its job printed; or its error."""
        manifest = manifest_from_log(logs) or {}
        if status is RayJobStatus.SUCCEEDED:
            if RETURN_KEY not in manifest:
                raise RayManifestError(f"Ray job {submission_id} (@task.ray function {self.function_name!r}) "
                                       "succeeded but printed no result; was its command changed?")
            return manifest[RETURN_KEY]
        if manifest.get("error") and manifest.get("retryable") is False:
            raise RayStageError(f"@task.ray function {self.function_name!r} failed: {manifest['error']} (Ray job "
                                f"{submission_id}; not retried, since another try would fail the same way)")
        reason = manifest.get("error") or last_lines(logs) or "see the job log above"
        raise RayJobFailedError(f"Ray job {submission_id} (@task.ray function {self.function_name!r}) ended "
                                f"{status.value if status else 'MISSING'}: {reason}")


def ray_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
             **kwargs: Any) -> TaskDecorator:
    """Wrap a function into a Ray job (``@task.ray``); ``kwargs`` are :class:`RayDecoratedOperator`'s.

    :param python_callable: the function to decorate.
    :param multiple_outputs: push each key of a returned dict as an XCom of its own too.
    """
    return task_decorator_factory(python_callable=python_callable, multiple_outputs=multiple_outputs,
                                  decorated_operator_class=RayDecoratedOperator, **kwargs)
