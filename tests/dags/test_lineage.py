"""Lineage through Airflow's OpenLineage integration: the datasets each task of the wine DAGs reports.

The DAG runs go through ``dag.test()`` in a child interpreter whose only difference is the
OpenLineage configuration (a real file transport), so the provider enables itself there as it
would for a team, while the rest of the suite runs with lineage off (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT, serve_apps_deleted_after_module
from tests.operators.test_ray_job import _xcom

# the same app on its own route as the other tests' models would meet: one of its own
APP = "lineage-wine"
delete_own_serve_apps = serve_apps_deleted_after_module(APP)
PIPELINE_CONF = {"demo_rows": 1500, "demo_seed": 1, "num_trials": 1, "families": ["xgboost"],
                 "num_boost_round": 20, "require_gpu": False, "serve_app": APP, "serve_route": f"/{APP}"}
SCORING_CONF = {"new_rows": 200, "serve_app": APP}
# (dag_id, logical date, conf, deferrable): the pipeline's stage tasks are deferred, so they report
# from the new operator that resumes each; the scoring's run straight through
RUNS = [("wine_quality_pipeline", "2026-09-01T12:00:00+00:00", PIPELINE_CONF, True),
        ("wine_batch_scoring", "2026-09-02T12:00:00+00:00", SCORING_CONF, False)]
# dag.test() one run; its run id and the tasks' states on a line of their own
RUN_DAG = """
import json, sys
from datetime import datetime
from tests.conftest import ROOT, load_dag
dag_id, when, conf = json.loads(sys.argv[1])
when = datetime.fromisoformat(when)
run = load_dag(dag_id, ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)
states = {ti.task_id: ti.state for ti in run.get_task_instances()}
print("LINEAGE_RUN " + json.dumps({"dag_id": dag_id, "run_id": run.run_id, "states": states}), flush=True)
"""


def test_dataset_names_follow_the_openlineage_naming_spec():
    from openlineage.client.naming.dataset import GCS, S3, LocalFileSystem, RemoteFileSystem

    from airflow_ray_ml.lineage import dataset_name

    def spec(naming) -> tuple[str, str]:  # the OpenLineage client's own helpers for the spec's names
        return naming.get_namespace(), naming.get_name()

    assert dataset_name("/data/red.csv") == spec(LocalFileSystem("/data/red.csv"))
    assert dataset_name("file:///data/splits/train/") == spec(LocalFileSystem("/data/splits/train"))
    assert dataset_name("data/red.csv") == ("file", os.path.join(os.getcwd(), "data/red.csv"))
    assert dataset_name("file://nas1/data/red.csv") == spec(RemoteFileSystem("nas1", "/data/red.csv"))
    assert dataset_name("s3://bucket/runs/train/model/") == spec(S3("bucket", "runs/train/model"))
    assert dataset_name("gs://bucket/new.csv") == spec(GCS("bucket", "new.csv"))
    assert dataset_name("http://127.0.0.1:8000/wine") == ("http://127.0.0.1:8000", "/wine")


def test_the_operators_load_no_openlineage_code_until_asked_for_lineage():
    # the provider is imported only when it calls: a worker without it runs the operators as before
    code = ("import sys\nfrom airflow_ray_ml import lineage, ray_job, ray_score, ray_serve\n"
            "print(sorted(m for m in sys.modules if m.startswith(('openlineage', 'airflow.providers.openlineage.'))"
            " and not m.endswith('.get_provider_info')))")  # the provider's config, which Airflow reads
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _datasets(facet_list: list[dict]) -> set[tuple[str, str]]:
    return {(dataset["namespace"], dataset["name"]) for dataset in facet_list}


@pytest.fixture(scope="module")
def lineage(airflow_db, ray_conn, tmp_path_factory):
    """The two wine DAGs' runs with a file transport: ``(runs, {job name: (inputs, outputs)})`` of
    the tasks' COMPLETE events."""
    events_file = tmp_path_factory.mktemp("lineage") / "events.jsonl"
    env = {**os.environ,
           "AIRFLOW__OPENLINEAGE__DISABLED": "False",
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                          "append": True}),
           # each task's event is written before the task ends: the task runner waits for it, in a
           # thread, up to execution_timeout
           "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
           "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "60"}
    runs, deadline = [], time.monotonic() + 840  # both within the test's timeout
    for dag_id, when, conf, deferrable in RUNS:
        result = subprocess.run([sys.executable, "-c", RUN_DAG, json.dumps([dag_id, when, conf])], cwd=ROOT,
                                env={**env, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": str(deferrable)},
                                capture_output=True, text=True, timeout=deadline - time.monotonic())
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "LINEAGE_RUN " in result.stdout, output[-4000:]
        runs.append(json.loads(result.stdout.rsplit("LINEAGE_RUN ", 1)[1].splitlines()[0]))
    complete: dict[str, tuple[set, set]] = {}
    for line in events_file.read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") == "COMPLETE" and "." in event["job"]["name"]:  # a task's, not a run's
            complete[event["job"]["name"]] = (_datasets(event["inputs"]), _datasets(event["outputs"]))
    return {run["dag_id"]: SimpleNamespace(**run) for run in runs}, complete


@pytest.mark.integration
def test_the_wine_pipeline_lineage_chains_source_splits_model_and_endpoint(lineage):
    runs, complete = lineage
    run = runs["wine_quality_pipeline"]
    assert run.states["deploy"] == "success", run.states

    def task(task_id: str) -> tuple[set, set]:
        return complete[f"wine_quality_pipeline.{task_id}"]

    source = {("file", uri) for uri in _xcom(run, "demo_data")["data_uris"]}
    assert len(source) == 2 and task("demo_data") == (set(), source)
    assert task("probe") == (set(), set())

    preprocessed = _xcom(run, "preprocess")
    splits = {("file", uri) for uri in preprocessed["split_uris"].values()}
    preprocess_in, preprocess_out = task("preprocess")
    assert preprocess_in == source  # the files demo_data wrote
    assert len(splits) == 3 and splits | {("file", preprocessed["preprocessor_uri"])} <= preprocess_out

    tune_in, tune_out = task("tune")
    assert tune_in <= preprocess_out and len(tune_in & splits) == 2  # train and validation: never the test split
    assert ("file", _xcom(run, "tune")["leaderboard_json_uri"]) in tune_out

    model = {("file", _xcom(run, "train")["model_dir"])}
    train_in, train_out = task("train")
    assert splits <= train_in <= preprocess_out and train_out == model

    serve_url = json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])["extra"]["serve_url"]
    assert _xcom(run, "deploy")["endpoint"] == f"{serve_url}/{APP}"
    assert task("deploy") == (model, {(serve_url, f"/{APP}")})


@pytest.mark.integration
def test_the_batch_scoring_lineage_reads_the_model_and_the_input_and_writes_the_predictions(lineage):
    runs, complete = lineage
    pipeline, run = runs["wine_quality_pipeline"], runs["wine_batch_scoring"]
    assert run.states["score"] == "success", run.states
    new_wines = {("file", uri) for uri in _xcom(run, "new_wines")["data_uris"]}
    assert complete["wine_batch_scoring.new_wines"] == (set(), new_wines)
    # the model the pipeline promoted, which the application serves
    model = {("file", _xcom(pipeline, "train")["model_dir"])}
    assert complete["wine_batch_scoring.score"] == (new_wines | model,
                                                    {("file", _xcom(run, "score")["output_uri"])})
