"""Bad input to the job core fails clearly: before any job for bad specs, with the stage's reason after."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_ray_ml.errors import RayOperatorError
from airflow_ray_ml.ray_job import RayJobOperator, manifest_from_log
from airflow_ray_ml_stages.constants import MANIFEST_LOG_MARKER


def _operator(**kwargs) -> RayJobOperator:
    from airflow.sdk import DAG

    with DAG(dag_id="errors", schedule=None, start_date=datetime(2026, 1, 1)):
        return RayJobOperator(task_id="t", **kwargs)


class _TI:
    dag_id = "errors"
    map_index = -1


def test_invalid_spec_fails_in_airflow_before_any_job_without_retries(tmp_path):
    from airflow_ray_ml.compat import AirflowFailException

    operator = _operator(stage="generate", spec={"rows": 1}, artifact_root=str(tmp_path))
    with pytest.raises(RayOperatorError, match="invalid generate spec.*rows must be an integer >= 2, got 1") as caught:
        operator.full_spec({"ti": _TI(), "run_id": "r1"})
    assert isinstance(caught.value, AirflowFailException)  # a retry would build the same bad spec


def test_spec_gets_this_task_runs_artifact_dir(tmp_path):
    operator = _operator(stage="generate", spec={"rows": 10}, artifact_root=str(tmp_path))
    spec = operator.full_spec({"ti": _TI(), "run_id": "manual__x"})
    assert spec == {"rows": 10, "artifact_dir": f"{tmp_path}/errors/manual__x/t"}


def test_runtime_env_ships_the_package_and_keeps_user_entries():
    operator = _operator(stage="generate", runtime_env={"env_vars": {"A": "1"}, "pip": ["x"]})
    env = operator.job_runtime_env()
    assert env["py_modules"][0].endswith("airflow_ray_ml_stages") and env["pip"] == ["x"]
    assert env["env_vars"]["A"] == "1" and env["env_vars"]["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.1"
    assert "py_modules" not in _operator(stage="generate", ship_package=False).job_runtime_env()


def test_entrypoint_quotes_the_spec_for_the_shell():
    operator = _operator(stage="generate")
    command = operator.stage_command({"artifact_dir": "/tmp/it's here", "rows": 5})
    assert command.startswith("python -m airflow_ray_ml_stages.generate --spec '")
    import shlex

    assert shlex.split(command)[-1] == '{"artifact_dir": "/tmp/it\'s here", "rows": 5}'


def test_manifest_from_log_takes_the_last_marked_line():
    log = f"noise\n{MANIFEST_LOG_MARKER}{{\"a\": 1}}\nmore\n{MANIFEST_LOG_MARKER}{{\"a\": 2}}\n"
    assert manifest_from_log(log) == {"a": 2}
    assert manifest_from_log("nothing here") is None


@pytest.mark.integration
def test_failing_stage_fails_the_task_with_the_jobs_reason(airflow_db, ray_conn):
    from tests.conftest import load_dag
    from tests.operators.test_ray_job import LOGICAL_DATE, _jobs_of
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.job_status import base_submission_id

    dag_run = load_dag("core_crashing_job").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    assert dag_run.state == "failed"
    jobs = _jobs_of(RayHook(), base_submission_id("core_crashing_job", dag_run.run_id, "broken"))
    assert len(jobs) == 1 and jobs[0]["status"] == "FAILED"


def test_unknown_stage_is_refused_before_any_job(tmp_path):
    operator = _operator(stage="generate; touch /tmp/x", artifact_root=str(tmp_path))
    with pytest.raises(RayOperatorError, match="unknown stage 'generate; touch /tmp/x'; it must be one of .*'train'"):
        operator.full_spec({"ti": _TI(), "run_id": "r1"})


@pytest.mark.integration
def test_stage_injected_through_run_conf_is_refused_before_any_job(airflow_db, fake_jobs_api, monkeypatch, tmp_path):
    import os

    from tests.conftest import load_dag
    from tests.operators.test_ray_job import LOGICAL_DATE

    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", os.environ["AIRFLOW_CONN_RAY_FAKE"])  # the DAG's connection
    marker = tmp_path / "injected"
    conf = {"stage": f"generate --spec '{{}}'; touch {marker}; python -m airflow_ray_ml_stages.generate"}
    dag_run = load_dag("core_stage_from_conf").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE, run_conf=conf)
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.state == "failed"  # at once: it has retries it did not use
    assert fake_jobs_api.requests == []  # refused before it asked the cluster anything
    assert not marker.exists()


@pytest.mark.integration
def test_bad_data_fails_after_one_try_with_the_stages_message(airflow_db, ray_conn, tmp_path):
    """A retry cannot fix bad data: the task fails on its first try, with the stage's own words."""
    import structlog

    from tests.conftest import load_dag
    from tests.operators.test_ray_job import _jobs_of
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.job_status import base_submission_id

    source = tmp_path / "bad.csv"
    source.write_text("x,y\n" + "".join(f"{i},{i % 7}\n" for i in range(40)) + "twelve,3\n")
    when = datetime(2026, 6, 2, tzinfo=timezone.utc)
    # format_exc_info turns the logged exception into text while it is being handled
    with structlog.testing.capture_logs(processors=[structlog.processors.format_exc_info]) as records:
        dag_run = load_dag("core_bad_data").test(logical_date=when, run_after=when, run_conf={"source": str(source)})
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.state == "failed" and ti.try_number == 1  # it had 2 retries left
    jobs = _jobs_of(RayHook(), base_submission_id("core_bad_data", dag_run.run_id, "preprocess"))
    assert len(jobs) == 1 and jobs[0]["status"] == "FAILED"
    (failure,) = [record for record in records if record["event"] == "Task failed with exception"]
    error = failure["exception"].strip().splitlines()[-1]  # the task's error: the exception's own line
    assert error.startswith("airflow_ray_ml.errors.RayStageError: stage data failed: DataSourceError: ")
    assert "'twelve'" in error and "not retried" in error
