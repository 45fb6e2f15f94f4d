"""Wine quality: from raw measurements to a served model, on Ray, orchestrated by Airflow.

Each task runs one Ray-side stage as a Ray job on the cluster named by the ``ray_default``
connection (the embedded local cluster under ``make run``); the Airflow worker only submits,
follows and records.

* ``probe`` decides GPU or CPU once for the whole run (a CUDA smoke test where GPUs are
  advertised; CPU with the reason otherwise) and sizes the workers so Ray Data keeps CPU headroom;
  its XCom is the compute spec that training and serving take.
* ``demo_data`` writes the seeded stand-in for the UCI wine-quality files (red and white,
  semicolon-separated as published) into this run's artifact directory.
* ``preprocess`` validates those files (or the ``source`` Param's), splits them
  deterministically, fits the scaler on the train split only and writes Parquet splits, the
  preprocessor JSON and a data profile, streaming with Ray Data.
* ``train`` fits the chosen model family on Ray Train (on GPU when the probe found one) and writes
  a model directory with its model card (test metrics, data fingerprint, config, versions).
* ``deploy`` promotes the model to the Ray Serve endpoint only if it beats the model being served
  on the same test split; otherwise the task is skipped ("kept champion"). A failed deploy or
  smoke test restores the previous version.

Trigger it from the UI to change the Params below.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, Param, task

from operators.gpu_probe import GPUProbeOperator
from operators.ray_data import RayDataPreprocessOperator
from operators.ray_job import RayJobOperator
from operators.ray_serve import RayServeDeployOperator
from operators.ray_train import RayTrainOperator

DEMO_ROWS = 6497  # the size of the published data set
DEMO_SEED = 7
SPLITS = "ti.xcom_pull('preprocess')"
# Weekly by default. `make run` sets WINE_PIPELINE_SCHEDULE=none, so unpausing the DAG for the demo
# does not also start the latest scheduled run next to the one it triggers.
SCHEDULE = os.environ.get("WINE_PIPELINE_SCHEDULE", "@weekly")
# Updated by `deploy` only when it promotes a model; its event carries the model's URI, version and
# test metrics. dags/wine_batch_scoring.py is scheduled on it.
WINE_MODEL = Asset("wine_quality_model")

with DAG(
    dag_id="wine_quality_pipeline",
    description="Probe, preprocess, train and serve a wine-quality model on Ray",
    schedule=None if SCHEDULE.lower() == "none" else SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,  # so Params and XComs reach the specs as numbers and lists
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "source": Param(None, type=["null", "array", "string"],
                        description="Your data instead of the demo: CSV/Parquet path(s) or URL(s)"),
        "label_column": Param("quality", type="string", description="The column to predict"),
        "label_range": Param([0, 10], type=["null", "array"],
                             description="[min, max] a label may take; rows outside fail the run"),
        "scaler": Param("standard", enum=["standard", "minmax", "none"], description="Feature scaling"),
        "family": Param("xgboost", enum=["xgboost", "lightning"], description="Model family to train"),
        "max_epochs": Param(30, type="integer", minimum=1, maximum=1000, description="Lightning epochs"),
        "num_boost_round": Param(200, type="integer", minimum=1, maximum=10000, description="XGBoost rounds"),
        "train_workers": Param(None, type=["null", "integer"], minimum=0, maximum=512,
                               description="Ray Train workers (0: local mode); empty sizes from the data"),
        "placement_strategy": Param("PACK", enum=["PACK", "SPREAD", "STRICT_SPREAD"],
                                    description="How training workers are placed on the cluster's nodes"),
        "require_gpu": Param(False, type="boolean", description="Fail instead of falling back to CPU"),
        "wait_for_gpu_s": Param(0, type="number", minimum=0, maximum=3600,
                                description="On autoscaling clusters: seconds to wait for a GPU node"),
        "deploy": Param(True, type="boolean", description="Promote the model to Ray Serve if it is better"),
        "min_improvement": Param(0.0, type="number", minimum=0,
                                 description="How much lower the test RMSE must be to replace the served model"),
        "demo_rows": Param(DEMO_ROWS, type="integer", minimum=100, maximum=10_000_000,
                           description="Rows of generated demo data"),
        "demo_seed": Param(DEMO_SEED, type="integer", minimum=0, description="Seed of the demo data"),
    },
    tags=["ray", "ml", "example"],
    doc_md=__doc__,
) as dag:
    probe = GPUProbeOperator(
        task_id="probe",
        require_gpu="{{ params.require_gpu }}",
        wait_for_gpu_s="{{ params.wait_for_gpu_s }}",
        doc_md="Decide GPU or CPU for this run; the XCom is the compute spec.",
    )
    demo_data = RayJobOperator(
        task_id="demo_data",
        stage="generate",
        spec={"rows": "{{ params.demo_rows }}", "seed": "{{ params.demo_seed }}", "file_format": "uci"},
        doc_md="Write the seeded demo data set (UCI layout) into this run's artifacts.",
    )
    preprocess = RayDataPreprocessOperator(
        task_id="preprocess",
        source="{{ params.source }}",  # None: the demo_data files
        source_task_id="demo_data",
        trigger_rule="none_failed_min_one_success",  # after demo_data, or straight after pick_data
        label_column="{{ params.label_column }}",
        scaler="{{ params.scaler }}",
        label_range="{{ params.label_range }}",
        doc_md="Validate, split and scale the data with Ray Data; the XCom lists the splits and the preprocessor.",
    )
    train = RayTrainOperator(
        task_id="train",
        family="{{ params.family }}",
        # each family takes only its own hyperparameters
        config="{{ {'max_epochs': params.max_epochs} if params.family == 'lightning' "
               "else {'num_boost_round': params.num_boost_round} }}",
        compute="{{ ti.xcom_pull('probe') }}",
        train_uri="{{ %s['split_uris']['train'] }}" % SPLITS,
        validation_uri="{{ %s['split_uris']['validation'] }}" % SPLITS,
        test_uri="{{ %s['split_uris']['test'] }}" % SPLITS,
        feature_columns="{{ %s['feature_columns'] }}" % SPLITS,
        label_column="{{ params.label_column }}",
        preprocessor_uri="{{ %s['preprocessor_uri'] }}" % SPLITS,
        data_fingerprint="{{ %s['fingerprint'] }}" % SPLITS,
        num_workers="{{ params.train_workers }}",
        placement_strategy="{{ params.placement_strategy }}",
        doc_md="Train on Ray Train; the XCom holds the model directory, its version and test metrics.",
    )

    @task.short_circuit(doc_md="Skip the deploy when the run's `deploy` Param is off.")
    def deploy_enabled(params: dict | None = None) -> bool:
        return bool((params or {}).get("deploy", True))

    deploy = RayServeDeployOperator(
        task_id="deploy",
        model="{{ ti.xcom_pull('train') }}",
        test_split_uri="{{ %s['split_uris']['test'] }}" % SPLITS,
        compute="{{ ti.xcom_pull('probe') }}",
        min_improvement="{{ params.min_improvement }}",
        outlets=[WINE_MODEL],
        doc_md="Promote the model to Ray Serve if it beats the served one; roll back on failure.",
    )

    @task.branch(doc_md="Use the `source` Param's files when given; generate the demo data otherwise.")
    def pick_data(params: dict | None = None) -> list[str]:
        return ["preprocess"] if (params or {}).get("source") else ["demo_data", "preprocess"]

    pick_data() >> [demo_data, preprocess]
    demo_data >> preprocess >> train >> deploy_enabled() >> deploy
    probe >> train
