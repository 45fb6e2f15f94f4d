"""Wine quality: from raw measurements to a served model, on Ray, orchestrated by Airflow.

Each task runs one Ray-side stage as a Ray job on the cluster named by the ``ray_default``
connection (the embedded local cluster under ``make run``); the Airflow worker only submits,
follows and records. Today the pipeline decides its compute and materialises the run's data set:

* ``probe`` decides GPU or CPU once for the whole run (a CUDA smoke test where GPUs are
  advertised; CPU with the reason otherwise) and sizes the workers so Ray Data keeps CPU headroom;
  its XCom is the compute spec later stages take.
* ``demo_data`` writes the seeded stand-in for the UCI wine-quality files (red and white,
  semicolon-separated as published) into this run's artifact directory and returns their URIs.
* ``preprocess`` validates those files (or the ``source`` Param's), splits them
  deterministically, fits the scaler on the train split only and writes Parquet splits, the
  preprocessor JSON and a data profile, streaming with Ray Data.

Later stages (probe, preprocess, tune, train, deploy) read their inputs from upstream manifests.
Trigger it from the UI to change the Params below.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from operators.gpu_probe import GPUProbeOperator
from operators.ray_data import RayDataPreprocessOperator
from operators.ray_job import RayJobOperator

DEMO_ROWS = 6497  # the size of the published data set
DEMO_SEED = 7

with DAG(
    dag_id="wine_quality_pipeline",
    description="Probe, preprocess, tune, train and serve a wine-quality model on Ray",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,  # so numeric Params reach the specs as numbers
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "demo_rows": Param(DEMO_ROWS, type="integer", minimum=100, maximum=10_000_000,
                           description="Rows of generated demo data"),
        "demo_seed": Param(DEMO_SEED, type="integer", minimum=0, description="Seed of the demo data"),
        "source": Param(None, type=["null", "array", "string"],
                        description="Your data instead of the demo: CSV/Parquet path(s) or URL(s)"),
        "label_column": Param("quality", type="string", description="The column to predict"),
        "label_range": Param([0, 10], type=["null", "array"],
                             description="[min, max] a label may take; rows outside fail the run"),
        "scaler": Param("standard", enum=["standard", "minmax", "none"], description="Feature scaling"),
        "require_gpu": Param(False, type="boolean", description="Fail instead of falling back to CPU"),
        "wait_for_gpu_s": Param(0, type="number", minimum=0, maximum=3600,
                                description="On autoscaling clusters: seconds to wait for a GPU node"),
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
        label_column="{{ params.label_column }}",
        scaler="{{ params.scaler }}",
        label_range="{{ params.label_range }}",
        doc_md="Validate, split and scale the data with Ray Data; the XCom lists the splits and the preprocessor.",
    )

    demo_data >> preprocess  # probe's compute spec feeds the training stages
