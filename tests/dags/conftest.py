"""The wine DAGs' runs that several test modules read: each runs once per session.

A fixture here finishes everything that needs its Serve application live (the HTTP calls, the
runs that meet its champion) before it returns, records what the tests assert, and deletes the
application: nothing it deployed holds the 2-CPU test cluster's CPUs after it, whichever module
asks first.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from tests.conftest import ROOT, _delete_serve_applications, load_dag
from tests.dags.wine_runs import ROW, SMALL, WINE_APP, WINE_ROUTE, run_dag_in_child, serve_url

# Lineage through Airflow's OpenLineage integration, in the children that run the regression DAGs
# (the rest of the suite runs with it off, tests/conftest.py): a real file transport; each task's
# event is written before the task ends (the task runner waits for it, in a thread, up to
# execution_timeout).
LINEAGE_ENV = {"AIRFLOW__OPENLINEAGE__DISABLED": "False",
               "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
               "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "60"}
SCENARIO_TIMEOUT_S = 1800  # the first test that asks for wine_regression waits for its three runs
RUN_TIMEOUT_S = 900


def pytest_collection_modifyitems(items):
    """A test that asks for ``wine_regression`` may run its scenario: the longer timeout."""
    for item in items:
        if "wine_regression" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(SCENARIO_TIMEOUT_S))


def _complete_events(events_file) -> dict[str, tuple[set, set]]:
    """``{job name: (inputs, outputs)}`` of the tasks' COMPLETE events, each as ``{(namespace, name)}``."""
    def datasets(facets: list[dict]) -> set[tuple[str, str]]:
        return {(dataset["namespace"], dataset["name"]) for dataset in facets}

    complete: dict[str, tuple[set, set]] = {}
    for line in events_file.read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") == "COMPLETE" and "." in event["job"]["name"]:  # a task's, not a run's
            complete[event["job"]["name"]] = (datasets(event["inputs"]), datasets(event["outputs"]))
    return complete


def write_shifted_wines(path: Path, rows: int = 600, seed: int = 2027) -> str:
    """New wines drawn as the demo's are, without the grade, with ``alcohol`` and ``density`` moved by
    two standard deviations and a tenth of them of a type training never saw (``rosé``)."""
    from airflow_ray_ml_stages import wine

    frame = wine.generate(rows=rows, seed=seed).drop(columns=[wine.LABEL])
    for column in SHIFTED_COLUMNS[:2]:
        frame[column] = frame[column] + 2 * frame[column].std()
    frame.loc[frame.index[::10], wine.TYPE_COLUMN] = "rosé"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return str(path)


SHIFTED_COLUMNS = ("alcohol", "density", "type")


def _run_here(dag_id: str, when: datetime, conf: dict) -> SimpleNamespace:
    """One run of a DAG of ``dags/`` through ``dag.test()`` in the test's own process, described as
    ``run_dag_in_child`` describes its runs."""
    run = load_dag(dag_id, ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)
    return SimpleNamespace(dag_id=dag_id, run_id=run.run_id, state=run.state, output="",
                           states={ti.task_id: ti.state for ti in run.get_task_instances()})


@pytest.fixture(scope="session")
def wine_regression(airflow_db, ray_conn, artifact_root, tmp_path_factory):
    """The regression pipeline end to end, once: what tests/dags/test_wine_pipeline.py,
    test_lineage.py and test_drift.py assert, from the same runs.

    1. ``wine_quality_pipeline`` with small Params and the Deploy Params as they start, its stage
       tasks deferred, then ``wine_batch_scoring`` on the model it promoted; both with lineage on.
    2. The champion's answers over HTTP: a prediction and its ``/metadata``.
    3. ``wine_batch_scoring`` again, on a file of shifted wines (``write_shifted_wines``) under the
       allowed sources: it finds drift, and its ``retrain`` task triggers the pipeline run that
       promoted the model again, with that run's Params (test_drift.py reads the triggered run).

    The gate against a served champion is the S3 test's second pipeline run (it scores the champion
    live on other data) and, for a challenger kept out, test_ray_serve.py's serve flow.
    """
    events_file = tmp_path_factory.mktemp("lineage") / "events.jsonl"
    env = {**os.environ, **LINEAGE_ENV, "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
        {"type": "file", "log_file_path": str(events_file), "append": True})}
    # the pipeline's stage tasks are deferred, so they report lineage from the new operator that
    # resumes each; the scoring's run straight through
    pipeline = run_dag_in_child(
        "wine_quality_pipeline", datetime(2026, 4, 1, tzinfo=timezone.utc), {**SMALL, "require_gpu": False},
        {**env, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True"}, RUN_TIMEOUT_S)
    assert pipeline.states.get("deploy") == "success", (pipeline.states, pipeline.output[-4000:])
    try:
        endpoint = f"{serve_url()}{WINE_ROUTE}"
        answer = requests.post(f"{endpoint}/predict", json={"instances": [ROW]}, timeout=30)
        card = requests.get(f"{endpoint}/metadata", timeout=10).json()
        scoring = run_dag_in_child(
            "wine_batch_scoring", datetime(2026, 4, 3, tzinfo=timezone.utc), {"new_rows": 400},
            {**env, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False"}, RUN_TIMEOUT_S)
        shifted = write_shifted_wines(Path(artifact_root) / "data" / "drift" / "shifted-wines.csv")
        # in this process, without lineage (test_lineage.py reads the first scoring's events) and
        # not deferred, as the suite runs: no child's imports and parse to pay for
        drifted = _run_here("wine_batch_scoring", datetime(2026, 4, 4, tzinfo=timezone.utc), {"input": shifted})
    finally:
        _delete_serve_applications({WINE_APP})
    return SimpleNamespace(pipeline=pipeline, scoring=scoring, drifted=drifted, shifted=shifted,
                           lineage=_complete_events(events_file), endpoint=endpoint, answer=answer, card=card)


@pytest.fixture(scope="module")
def own_serve_apps():
    """The names of the Serve applications a module's tests deploy; they are deleted together when
    the module ends (each deletion waits for its replicas to stop: one wait, not one a test)."""
    names: set[str] = set()
    yield names
    _delete_serve_applications(names)
