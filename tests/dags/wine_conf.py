"""What the wine DAG's tasks build from a run conf, without Ray: the check behind its Params tests.

A conf is accepted when every task gets as far as the task itself would before any Ray job: the
Params validate as at trigger time, each operator's templates render against them, each stage
operator coerces and validates its spec (``full_spec``), the deploy operator checks its names and
settings, and the ``@task`` functions run. Upstream results come from samples in the shape each
upstream task returns. Whatever a task would raise for the conf, :func:`build_tasks` raises.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from airflow_ray_ml_stages.specs import ComputeSpec

DAG_ID = "wine_quality_pipeline"
RUN_ID = "manual__form"
_SERVED: dict[str, Any] = {}  # dag_id -> the DAG as the api-server holds it (serializing takes a while)


def _samples(params: dict[str, Any], files: list[str], space: dict[str, Any]) -> dict[str, Any]:
    """Each upstream task's XCom for this conf, in the shape that task returns."""

    def first(value: Any) -> Any:  # a search-space entry: a fixed value, or the first of a choice/grid
        return next(iter(value.values()))[0] if isinstance(value, dict) else value

    label = params["label_column"]
    return {
        "probe": ComputeSpec.cpu("sample").to_dict(),
        "demo_data": {"data_uris": ["/demo/winequality-red.csv", "/demo/winequality-white.csv"]},
        "data_files": files,
        "search_space": space,
        "preprocess": {
            "split_uris": {name: f"/run/preprocess/{name}" for name in ("train", "validation", "test")},
            "feature_columns": ["alcohol", "pH"], "label_column": label,
            "preprocessor_uri": "/run/preprocess/preprocessor.json", "fingerprint": "sample",
            "preprocessor_variants": None,
        },
        "tune": {"best_config": {"family": first(space["family"]), "scaler": first(space["scaler"])}},
        "train": {"model_dir": "/run/train/model", "model_version": "v1", "metrics": {"test": {"rmse": 0.7}}},
    }


def trigger_params(dag, conf: dict[str, Any]) -> dict[str, Any]:
    """The run's Params as the api-server resolves them when the run is triggered (its serialized DAG's
    Params merged with ``conf``); ``ParamValidationError`` where the trigger refuses the conf."""
    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1 names it SerializedDAG
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    if dag.dag_id not in _SERVED:
        _SERVED[dag.dag_id] = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    params = _SERVED[dag.dag_id].params
    if not hasattr(params, "deep_merge"):  # Airflow 3.1's create_dagrun: a copy, updated with the conf
        params = copy.deepcopy(params)
        params.update(conf or {})
        return params.validate()
    return params.deep_merge(conf).validate()


def build_tasks(dag, conf: dict[str, Any], artifact_root: str) -> dict[str, Any]:
    """What each task of ``dag`` builds for a run with ``conf``; raises what a task would raise.

    Returns ``{task_id: built}``: a stage operator's full spec, the deploy operator's rendered
    settings, a ``@task``'s return value.
    """
    from airflow.sdk.definitions.xcom_arg import XComArg

    from airflow_ray_ml.ray_job import RayJobOperator
    from airflow_ray_ml.ray_serve import RayServeDeployOperator

    params = trigger_params(dag, conf)
    tasks = dag.task_dict
    built: dict[str, Any] = {"pick_data": tasks["pick_data"].python_callable(params=params)}
    generated = {"data_uris": ["/demo/winequality-red.csv", "/demo/winequality-white.csv"]}
    built["data_files"] = tasks["data_files"].python_callable(
        generated if "demo_data" in built["pick_data"] else None, params=params)
    built["search_space"] = tasks["search_space"].python_callable(params=params)
    built["deploy_enabled"] = tasks["deploy_enabled"].python_callable(params=params)
    samples = _samples(params, built["data_files"], built["search_space"])

    context = {"params": params, "run_id": RUN_ID, "dag": dag,
               "ti": SimpleNamespace(dag_id=dag.dag_id, task_id="", map_index=-1)}
    for task_id, task in tasks.items():
        if task_id in built:
            continue
        task = copy.deepcopy(task)
        for name in task.template_fields:  # results of upstream tasks: their samples
            value = getattr(task, name)
            if isinstance(value, XComArg):
                upstream = samples[value.operator.task_id]
                key = getattr(value, "key", "return_value")
                setattr(task, name, upstream if key == "return_value" else upstream[key])
        task.render_template_fields(context)
        if isinstance(task, RayJobOperator):
            task.artifact_root = artifact_root  # otherwise read from the ray connection
            built[task_id] = task.full_spec(context)
        elif isinstance(task, RayServeDeployOperator):
            task.check_endpoint_names()
            task.coerce_settings()
            built[task_id] = {"app_name": task.app_name, "route_prefix": task.route_prefix,
                              "min_improvement": task.min_improvement, "on_schema_change": task.on_schema_change}
        else:
            raise AssertionError(f"{task_id}: a task this check does not know how to build ({type(task).__name__})")
    return built
