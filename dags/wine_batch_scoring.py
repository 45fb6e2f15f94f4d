"""Wine quality, batch scoring: every newly promoted model scores a file of new wines on Ray Data.

Scheduled on the ``wine_quality_model`` Asset, which the pipeline's ``deploy`` task updates only
when it promotes a model (a kept champion or a failed deploy emits no event). The asset event
carries the model's directory, version and test metrics; this DAG scores with exactly that model.

* ``pick_input`` scores the ``input`` Param's file when one is given, else makes demo data.
* ``new_wines`` writes seeded new wines without a quality grade (comma CSV) into this run's
  artifacts: the demo's stand-in for the file a lab would drop off.
* ``promoted_model`` reads the model from the triggering asset event; on a manual run without
  one, ``score`` uses the model Ray Serve serves now.
* ``score`` runs the ``score`` stage as a Ray job: actors that each load the model once score the
  file in batches, and the rows plus ``predicted_quality`` land next to the input as
  ``<name>.predictions-<model version>`` (never over an earlier output).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, Param, task

from operators.ray_job import RayJobOperator
from operators.ray_score import RayBatchScoreOperator

# The same name as the pipeline's deploy outlet (dags/wine_quality_pipeline.py): Airflow matches
# assets by name, so this DAG runs after every promotion.
WINE_MODEL = Asset("wine_quality_model")

with DAG(
    dag_id="wine_batch_scoring",
    description="Score new wines with each newly promoted wine-quality model, on Ray Data",
    schedule=[WINE_MODEL],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "input": Param(None, type=["null", "string"],
                       description="The file (or directory) to score: CSV or Parquet, local, s3:// or gs://. "
                                   "Empty: generated new wines"),
        "new_rows": Param(1000, type="integer", minimum=1, maximum=10_000_000,
                          description="Rows of generated new wines when no input is given"),
        "new_seed": Param(2026, type="integer", minimum=0, description="Seed of the generated new wines"),
    },
    tags=["ray", "ml", "example"],
    doc_md=__doc__,
) as dag:

    @task.branch(doc_md="Score the `input` Param's file, or generate new wines first.")
    def pick_input(params: dict | None = None) -> list[str]:
        return ["score"] if (params or {}).get("input") else ["new_wines", "score"]

    new_wines = RayJobOperator(
        task_id="new_wines",
        stage="generate",
        spec={"rows": "{{ params.new_rows }}", "seed": "{{ params.new_seed }}", "file_format": "csv",
              "with_label": False, "name": "new_wines"},
        doc_md="Write seeded new wines (no quality grade) into this run's artifacts.",
    )

    @task(doc_md="The promoted model named by the triggering asset event (None on a manual run).")
    def promoted_model(triggering_asset_events=None) -> dict | None:
        for events in (triggering_asset_events or {}).values():
            for event in reversed(list(events)):
                if event.extra and event.extra.get("model_dir"):
                    return dict(event.extra)
        return None

    score = RayBatchScoreOperator(
        task_id="score",
        input_uri="{{ params.input or ti.xcom_pull('new_wines')['data_uris'][0] }}",
        model="{{ ti.xcom_pull('promoted_model') }}",  # None: the model Serve serves now
        trigger_rule="none_failed_min_one_success",  # runs whichever branch fed it
        doc_md="Score the file with Ray Data; predictions are written next to it.",
    )

    pick_input() >> [new_wines, score]
    new_wines >> score
    promoted_model() >> score
