"""Lineage through Airflow's OpenLineage integration: the datasets each task of the wine DAGs reports.

The events come from the regression pipeline's and its batch scoring's one run (``wine_regression``,
tests/dags/conftest.py), which go through ``dag.test()`` in a child interpreter whose only
difference is the OpenLineage configuration (a real file transport), so the provider enables
itself there as it would for a team, while the rest of the suite runs with lineage off
(tests/conftest.py).
"""

from __future__ import annotations

import os

import pytest

from tests.child import run_python
from tests.dags.wine_runs import WINE_ROUTE, serve_url
from tests.operators.test_ray_job import _xcom


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
            "report(sorted(m for m in sys.modules if m.startswith(('openlineage', 'airflow.providers.openlineage.'))"
            " and not m.endswith('.get_provider_info')))")  # the provider's config, which Airflow reads
    assert run_python(code).result == []


@pytest.mark.integration
def test_the_wine_pipeline_lineage_chains_source_splits_model_and_endpoint(wine_regression):
    run, complete = wine_regression.pipeline, wine_regression.lineage
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

    assert _xcom(run, "deploy")["endpoint"] == f"{serve_url()}{WINE_ROUTE}"
    assert task("deploy") == (model, {(serve_url(), WINE_ROUTE)})


@pytest.mark.integration
def test_the_batch_scoring_lineage_reads_the_model_and_the_input_and_writes_the_predictions(wine_regression):
    complete = wine_regression.lineage
    pipeline, run = wine_regression.pipeline, wine_regression.scoring
    assert run.states["score"] == "success", run.states
    new_wines = {("file", uri) for uri in _xcom(run, "new_wines")["data_uris"]}
    assert complete["wine_batch_scoring.new_wines"] == (set(), new_wines)
    # the model the pipeline promoted, which the application serves
    model = {("file", _xcom(pipeline, "train")["model_dir"])}
    assert complete["wine_batch_scoring.score"] == (new_wines | model,
                                                    {("file", _xcom(run, "score")["output_uri"])})
