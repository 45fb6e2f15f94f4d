"""``@task.ray``: the function's source cut out and checked, its arguments checked, and one DAG run of
real Ray jobs (a dict returned, a retry that re-attaches, a function that raises)."""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone

import pytest
from airflow.sdk import DAG, task

from airflow_ray_ml.decorators.ray import ray_task, task_function_source
from airflow_ray_ml.errors import RayTaskFunctionError
from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import base_submission_id
from tests.child import run_python
from tests.conftest import ROOT, load_dag
from tests.operators.test_ray_job import _jobs_of, _xcom

ROWS = 3


@task.ray(entrypoint_num_cpus=0.5)
def _decorated(rows: "pd.DataFrame", names=("a", None), *, scale={"by": -2.5}) -> dict:  # noqa: F821
    # kept: the comment and the body, not the decorator
    import math

    return {"roots": [math.sqrt(row) * scale["by"] for row in range(rows)], "names": list(names)}


def _uses_the_module() -> str:
    return json.dumps(ROWS)


def _default_from_the_module(rows=ROWS):
    return rows


def _wrapper(function):
    @functools.wraps(function)
    def wrapped(*args):
        return function(*args)
    return wrapped


def _closure():
    rows = 3

    def inner():
        return rows
    return inner


def test_task_function_source_of_a_decorated_function_is_its_def_alone_and_runs_alone():
    source = task_function_source(_decorated.function)
    assert source.startswith("def _decorated(") and "@" not in source and "# kept" in source
    namespace: dict = {}
    exec(compile("from __future__ import annotations\n" + source, "<module>", "exec"), namespace)  # as the job does
    assert namespace["_decorated"](2) == {"roots": [-0.0, -2.5], "names": ["a", None]}


@pytest.mark.parametrize(("function", "message"), [
    (lambda rows: rows, "is a lambda.*define it with def"),
    (_closure(), r"is a closure over \['rows'\].*pass them as arguments"),
    (_uses_the_module, r"uses \['ROWS', 'json'\] from outside it.*import inside it"),
    (_default_from_the_module, "has the default 'ROWS'.*give a literal"),
    (_wrapper(_uses_the_module), "is wrapped by another decorator"),
    (print, "decorate a function defined with def"),
])
def test_task_function_source_of_a_function_that_cannot_stand_alone_is_refused_naming_the_fix(function, message):
    with pytest.raises(RayTaskFunctionError, match=message):
        task_function_source(function)


def test_task_ray_decorating_a_closure_fails_when_the_dag_is_parsed():
    with DAG(dag_id="closure", schedule=None), pytest.raises(RayTaskFunctionError, match="closure over"):
        task.ray(_closure())()


def test_task_ray_is_the_providers_decorator_and_takes_no_command():
    assert task.ray is ray_task  # registered through get_provider_info's task-decorators
    with DAG(dag_id="command", schedule=None), pytest.raises(RayTaskFunctionError, match=r"given \['entrypoint'\]"):
        task.ray(entrypoint="python x.py")(_uses_the_module)()


@pytest.mark.parametrize(("arguments", "message"), [
    ({"rows": datetime(2026, 1, 1)}, r"not JSON: kwargs\['rows'\] is a datetime.datetime"),
    ({"rows": 3, "names": [{1: "a"}]}, r"kwargs\['names'\]\[0\] has the key 1, a int"),
    ({"names": []}, "cannot be called with its arguments: missing a required argument: 'rows'"),
    ({"rows": 1, "names": ["x" * 100_000]}, "gets 1000.. bytes of arguments, more than a job's command line"),
])
def test_call_arguments_that_cannot_travel_fail_before_any_job(arguments, message):
    with DAG(dag_id="arguments", schedule=None):
        operator = _decorated.override(task_id="call")(**{"rows": 1, **arguments}).operator
    operator.op_kwargs = arguments  # as rendered when the task runs
    with pytest.raises(RayTaskFunctionError, match=message):
        operator.call_arguments()


def test_call_arguments_travel_as_json_beside_the_functions_module():
    with DAG(dag_id="arguments", schedule=None):
        operator = _decorated(ROWS, ("x", "y")).operator
    command = operator.job_entrypoint(None)
    assert command.startswith("python -m airflow_ray_ml_stages.task_function --module rayml_task__decorated "
                              "--function _decorated --arguments ")
    assert json.loads(command.split("--arguments ", 1)[1].strip("'")) == {"args": [3, ["x", "y"]], "kwargs": {}}
    assert operator.entrypoint_num_cpus == 0.5 and operator.multiple_outputs is True


def test_parsing_the_task_ray_dag_imports_no_ray():
    code = ("import sys\ntry:\n    from airflow.dag_processing.dagbag import DagBag\n"
            "except ImportError:\n    from airflow.models.dagbag import DagBag  # Airflow 3.1\n"
            f"bag = DagBag(dag_folder={str(ROOT / 'tests' / 'dag_fixtures' / 'task_ray_dags.py')!r})\n"
            "assert not bag.import_errors and 'task_ray' in bag.dags, bag.import_errors\n"
            "report(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    assert run_python(code, cwd=ROOT).result == []


@pytest.mark.integration
def test_task_ray_dag_returns_json_reattaches_on_retry_and_fails_with_the_functions_error(
        airflow_db, ray_conn, artifact_root, capfd):
    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    dag_run = load_dag("task_ray").test(logical_date=when, run_after=when)
    tries = {ti.task_id: (ti.state, ti.try_number) for ti in dag_run.get_task_instances()}
    assert tries == {"totals": ("success", 1), "echo_slowly": ("success", 2), "broken": ("failed", 1)}

    totals = _xcom(dag_run, "totals")
    artifact_dir = totals.pop("artifact_dir")
    assert totals == {"rows": 100, "total": 2475.0, "names": ["a", "b"], "greeting": "hello"}
    assert artifact_dir.startswith(artifact_root) and "task_ray" in artifact_dir
    assert _xcom(dag_run, "totals", key="rows") == 100  # `-> dict`: each key an XCom too, as with @task
    assert _xcom(dag_run, "echo_slowly") == [2475.0, ["a", "b"]]  # the XCom passed on as an argument

    base_id = base_submission_id("task_ray", dag_run.run_id, "echo_slowly")
    jobs = _jobs_of(RayHook(), base_id)
    assert [job["submission_id"] for job in jobs] == [base_id] and jobs[0]["status"] == "SUCCEEDED"
    out = capfd.readouterr().out
    assert f"Ray job {base_id}: submit" in out and f"Ray job {base_id}: attach" in out  # no second job
    failure = [line for line in out.splitlines() if "RayJobFailedError" in line or "ended FAILED" in line]
    assert any("(@task.ray function 'broken') ended FAILED: ValueError: sales.csv: column 'price' has text 'n/a' "
               "in row 2; clean the export" in line for line in failure), failure
    assert "[ray] Traceback (most recent call last):" in out  # the function's traceback, in the task log
