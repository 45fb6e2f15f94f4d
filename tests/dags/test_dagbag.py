"""Every DAG in dags/ parses without import errors and reads like the docs promise."""

from __future__ import annotations

from tests.conftest import ROOT, dag_bag


def _bag():
    return dag_bag(ROOT / "dags")


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


def test_the_pipeline_runs_weekly_and_the_scoring_retrains_it_on_drift(monkeypatch):
    bag = _bag()
    pipeline, scoring = bag.dags["wine_quality_pipeline"], bag.dags["wine_batch_scoring"]
    score = scoring.task_dict["score"]
    weekly = pipeline.timetable  # the task SDK's timetable names it expression, Airflow 3.1's _expression
    assert getattr(weekly, "expression", getattr(weekly, "_expression", None)) == "0 0 * * 0"
    assert type(weekly).__name__ == "CronTriggerTimetable"  # no Asset: drift retrains through the scoring's task
    # the drift event goes out through an alias, the task's only outlet: a stable file emits no event
    assert [outlet.name for outlet in score.outlets] == [f"airflow-ray-ml-drift:{score.drift_asset.name}"]
    # after the scoring, the served model's own run is planned and triggered again: the pipeline's
    retrain = scoring.task_dict["retrain"]
    assert retrain.trigger_dag_id == "wine_quality_pipeline"
    assert scoring.task_dict["retraining"].downstream_task_ids == {"retrain"}
    assert "score" in scoring.task_dict["retraining"].upstream_task_ids
    monkeypatch.setenv("WINE_PIPELINE_SCHEDULE", "none")  # as `make run` parses it: no weekly run
    assert _bag().dags["wine_quality_pipeline"].schedule is None


def test_a_search_space_of_the_wrong_shape_is_refused_when_the_run_is_triggered():
    """What the REST API and the trigger form do with a run's conf: merge it over the Params and validate."""
    import copy

    import pytest
    from airflow.sdk.definitions.param import ParamValidationError

    from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE

    params = _bag().dags["wine_quality_pipeline"].params

    def validate(space: dict) -> None:
        merged = copy.deepcopy(params)
        merged.update({"search_space": space})
        merged.validate()

    validate(DEFAULT_SEARCH_SPACE)  # the documented shape passes
    validate({"family": "xgboost", "xgboost": {"max_leaves": 31}})  # XGBoost takes booster parameters of its own
    for bad in ({"family": {"choice": ["lightning", "sklearn"]}}, {"famliy": "xgboost"},
                {"lightning": {"learning_rate": 0.1}}):
        with pytest.raises(ParamValidationError, match="search_space"):
            validate(bad)
