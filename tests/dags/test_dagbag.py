"""Every DAG in dags/ parses without import errors and reads like the docs promise."""

from __future__ import annotations

from tests.conftest import ROOT


def _bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dagbag_has_no_import_errors():
    bag = _bag()
    assert bag.import_errors == {}
    assert {"wine_quality_pipeline", "wine_batch_scoring"} <= set(bag.dag_ids)


def test_wine_dag_is_documented_scheduled_and_retries():
    dag = _bag().dags["wine_quality_pipeline"]
    assert dag.doc_md and "Ray job" in dag.doc_md
    assert dag.schedule is not None
    assert all(task.retries >= 1 for task in dag.tasks)
    assert {"demo_rows", "demo_seed", "require_gpu", "wait_for_gpu_s"} <= set(dag.params.keys())
    assert {"probe", "demo_data", "preprocess", "tune", "train", "deploy"} <= set(dag.task_ids)
    assert dag.task_dict["tune"].downstream_task_ids == {"train"}
    assert [outlet.name for outlet in dag.task_dict["deploy"].outlets] == ["wine_quality_model"]


def test_scoring_dag_is_scheduled_on_the_model_asset_the_pipeline_updates():
    bag = _bag()
    scoring = bag.dags["wine_batch_scoring"]
    deploy = bag.dags["wine_quality_pipeline"].task_dict["deploy"]
    assets = scoring.timetable.asset_condition.objects
    assert [asset.name for asset in assets] == [outlet.name for outlet in deploy.outlets]
