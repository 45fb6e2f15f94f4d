"""RayJobOperator with an entrypoint: a user's own script run as a Ray job, end to end with dag.test()."""

from __future__ import annotations

import os
import textwrap
from datetime import datetime, timezone

import pytest

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.job_status import base_submission_id
from airflow_ray_ml.ray_job import RayJobOperator, last_json_line
from tests.conftest import ROOT, load_dag
from tests.operators.test_ray_job import _jobs_of, _xcom

LOGICAL_DATE = datetime(2026, 4, 1, tzinfo=timezone.utc)


def _run_script(tmp_path, body: str, when: datetime = LOGICAL_DATE):
    """Write ``job.py`` (and a helper module beside it) into a folder and run it as the job's working_dir."""
    (tmp_path / "helper.py").write_text("def double(value):\n    return 2 * value\n")
    (tmp_path / "job.py").write_text(textwrap.dedent(body))
    return load_dag("job_own_script").test(logical_date=when, run_after=when,
                                           run_conf={"dir": str(tmp_path), "script": "job.py"})


def _supervisor_resources(submission_id: str) -> dict:
    """What the job's supervisor actor (which runs the entrypoint) reserved, from Ray's State API."""
    answer = RayHook().get_json("/api/v0/actors", params={
        "filter_keys": "class_name", "filter_predicates": "=", "filter_values": "JobSupervisor", "detail": "true"})
    actors = [actor for actor in answer["data"]["result"]["result"] if submission_id in (actor.get("name") or "")]
    assert len(actors) == 1, actors
    return actors[0]["required_resources"]


def test_either_a_stage_or_an_entrypoint_is_given():
    with pytest.raises(ValueError, match="either stage= .* or entrypoint="):
        RayJobOperator(task_id="both", stage="generate", entrypoint="python x.py")
    with pytest.raises(ValueError, match="either stage= .* or entrypoint="):
        RayJobOperator(task_id="neither")
    with pytest.raises(ValueError, match="spec= goes with stage="):
        RayJobOperator(task_id="spec", entrypoint="python x.py", spec={"rows": 3})
    assert RayJobOperator(task_id="stage", stage="generate").multiple_outputs is True
    assert RayJobOperator(task_id="command", entrypoint="python x.py").multiple_outputs is False


def test_last_json_line_is_the_last_object_or_list_printed():
    assert last_json_line('start\n{"a": 1}\n[1, 2]\nbye\n') == [1, 2]
    assert last_json_line('{"a": 1}\n{not json\n42\n"text"\n') == {"a": 1}
    assert last_json_line("nothing here\n") is None
    assert last_json_line('RAYML_MANIFEST {"a": 1}\n') is None


@pytest.mark.integration
def test_own_script_with_a_working_dir_returns_its_last_json_line(airflow_db, ray_conn, artifact_root, tmp_path):
    dag_run = _run_script(tmp_path, """
        import argparse, json, os
        import ray
        from helper import double   # shipped with the working_dir

        parser = argparse.ArgumentParser()
        parser.add_argument("--greeting")
        args = parser.parse_args()
        ray.init()
        squares = ray.get([ray.remote(lambda x: x * x).options(num_cpus=0.1).remote(i) for i in range(4)])
        print(json.dumps({"draft": True}))
        print("almost done")
        print(json.dumps({"greeting": args.greeting, "squares": squares, "doubled": double(21),
                          "artifact_dir": os.environ["RAYML_ARTIFACT_DIR"]}))
    """)
    assert dag_run.state == "success"
    result = _xcom(dag_run, "own")
    assert result["greeting"] == "hello" and result["squares"] == [0, 1, 4, 9] and result["doubled"] == 42
    assert result["artifact_dir"].startswith(artifact_root) and "job_own_script" in result["artifact_dir"]
    (job,) = _jobs_of(RayHook(), base_submission_id("job_own_script", dag_run.run_id, "own"))
    assert job["status"] == "SUCCEEDED" and job["entrypoint"] == "python job.py --greeting hello"
    assert _supervisor_resources(job["submission_id"]) == {"CPU": 0.25}  # entrypoint_num_cpus reserved
    assert job["metadata"]["team"] == "growth" and job["metadata"]["airflow_task_id"] == "own"
    assert _xcom(dag_run, "own", key="ray_job")["submission_id"] == job["submission_id"]


@pytest.mark.integration
def test_own_script_that_reports_a_result_returns_its_manifest(airflow_db, ray_conn, tmp_path):
    dag_run = _run_script(tmp_path, """
        import json
        from airflow_ray_ml_stages.job_result import report_result

        report_result({"rows": 7, "output": "s3://bucket/out.parquet"})
        print(json.dumps({"printed": "after the report"}))
    """, when=datetime(2026, 4, 2, tzinfo=timezone.utc))
    assert dag_run.state == "success"
    manifest = _xcom(dag_run, "own")
    assert manifest["rows"] == 7 and manifest["status"] == "succeeded" and "printed" not in manifest
    with open(os.path.join(manifest["artifact_dir"], "manifest.json")) as handle:
        assert '"rows": 7' in handle.read()


@pytest.mark.integration
def test_failing_script_fails_the_task_with_the_scripts_error(airflow_db, ray_conn, tmp_path, capfd):
    dag_run = _run_script(tmp_path, """
        rows = [{"price": "12.5"}, {"price": "n/a"}]
        for number, row in enumerate(rows, 1):
            if not row["price"].replace(".", "").isdigit():
                raise ValueError(f"column 'price' has text {row['price']!r} in row {number}; clean the export")
    """, when=datetime(2026, 4, 3, tzinfo=timezone.utc))
    assert dag_run.state == "failed"
    (job,) = _jobs_of(RayHook(), base_submission_id("job_own_script", dag_run.run_id, "own"))
    assert job["status"] == "FAILED"
    failure = [line for line in capfd.readouterr().out.splitlines() if "RayJobFailedError" in line or "ended FAILED" in line]
    assert any("ValueError: column 'price' has text 'n/a' in row 2; clean the export" in line for line in failure), failure


@pytest.mark.integration
def test_example_dag_profiles_a_generated_table_with_the_users_script(airflow_db, ray_conn):
    when = datetime(2026, 4, 4, tzinfo=timezone.utc)
    dag_run = load_dag("ray_job_example", ROOT / "dags").test(logical_date=when, run_after=when,
                                                               run_conf={"rows": 3000})
    assert dag_run.state == "success"
    profile = _xcom(dag_run, "profile")
    assert profile["rows"] == 3000
    assert set(profile["columns"]) == {"temperature_c", "humidity_pct", "wind_kmh"}
    humidity = profile["columns"]["humidity_pct"]
    assert humidity["missing"] > 0 and humidity["count"] + humidity["missing"] == 3000
    assert 20 <= humidity["min"] < humidity["max"] <= 100


@pytest.mark.integration
def test_example_dag_table_outside_the_allowed_sources_fails_before_the_job(airflow_db, ray_conn):
    when = datetime(2026, 4, 5, tzinfo=timezone.utc)
    dag_run = load_dag("ray_job_example", ROOT / "dags").test(logical_date=when, run_after=when,
                                                               run_conf={"source": "/etc/passwd"})
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "failed" and states == {"table": "failed", "profile": "upstream_failed"}
    assert _jobs_of(RayHook(), base_submission_id("ray_job_example", dag_run.run_id, "profile")) == []
