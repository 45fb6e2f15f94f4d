"""Wine quality, batch scoring: every newly promoted model scores a file of new wines on Ray Data.

Scheduled on the ``wine_quality_model`` Asset, which the pipeline's ``deploy`` task updates only
when it promotes a model (a kept champion or a failed deploy emits no event). The asset event
carries the model's directory, version and test metrics; this DAG scores with exactly that model.

* ``model_to_score`` reads the model from the triggering asset event; on a manual run without
  one, it is the model that the ``serve_app`` application serves now. Its XCom adds the raw
  columns the model needs (from its preprocessor).
* ``pick_input`` scores the ``input`` Param's file when one is given (``scoring_input`` refuses one
  outside the allowed sources, docs/deployment.md#confined-sources). Otherwise it makes demo
  data, but only for a model of the wine columns: a model trained on another table (``make run
  SOURCE=... LABEL=...``) skips the run, with the reason in this task's log and its
  ``skip_reason`` XCom, instead of scoring wines it cannot read.
* ``new_wines`` writes seeded new wines without a quality grade (comma CSV) into this run's
  artifacts: the demo's stand-in for the file a lab would drop off.
* ``score`` runs the ``score`` stage as a Ray job: actors that each load the model once score the
  file in batches, and the rows plus ``predicted_quality`` land next to the input as
  ``<name>.predictions-<model version>`` (never over an earlier output). It also compares the file
  with the model's training data, column by column (population stability index; the report is
  written beside the predictions and is in the XCom); where the file has drifted, it updates the
  ``wine_quality_model/drift`` Asset (the record the "Ray ML" page lists).
* ``retraining`` and ``retrain``: where the file has drifted, the run that trained and promoted the
  scored model runs again: the same DAG with the same Params (its source, label, task, rollout and
  approval), which the deploy kept with the model (``airflow_ray_ml.drift_retrain``). Its note says
  which drift started it; the ``retrain_with`` Param's files of labelled rows (under the allowed
  sources) are read after the model's own source. A model whose run was not kept starts nothing;
  ``retraining`` says so.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, Param, task

from airflow_ray_ml.confine import confine_sources
from airflow_ray_ml.drift_retrain import DriftRetrainOperator
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_score import RayBatchScoreOperator
from airflow_ray_ml_stages.specs import SCORE_MISSING_VALUES, SCORE_UNSEEN_CATEGORIES, ScoreSpec
from airflow_ray_ml_stages.wine import DEMO_APP, DRIFT_ASSET

# The same name as the pipeline's deploy outlet (dags/wine_quality_pipeline.py): Airflow matches
# assets by name, so this DAG runs after every promotion.
WINE_MODEL = Asset("wine_quality_model")
PIPELINE = "wine_quality_pipeline"  # what trains the models it scores, and retrains them on drift

with DAG(
    dag_id="wine_batch_scoring",
    description="Score new wines with each newly promoted wine-quality model, on Ray Data",
    schedule=[WINE_MODEL],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
    params={
        "input": Param(None, type=["null", "string"],
                       description="The file (or directory) to score: CSV or Parquet, local, s3:// or gs://, "
                                   "under the allowed sources (the artifact root's data folder, and the "
                                   "ray_default connection's allowed_sources). Empty: generated new wines"),
        "retrain_with": Param(None, type=["null", "array"], items={"type": "string"}, title="New labelled data",
                              description="Files of labelled rows (the served model's columns and its label) "
                                          "that a retraining this run's drift starts reads after the model's own "
                                          "source, one per line, under the allowed sources. Empty: the model's "
                                          "own source only"),
        "new_rows": Param(1000, type="integer", minimum=1, maximum=10_000_000,
                          description="Rows of generated new wines when no input is given"),
        "new_seed": Param(2026, type="integer", minimum=0, description="Seed of the generated new wines"),
        "serve_app": Param(DEMO_APP, type="string", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
                           description="On a run not started by a promotion: the Serve application whose "
                                       "model scores"),
        "missing_values": Param(ScoreSpec.missing_values, type="string", enum=list(SCORE_MISSING_VALUES),
                                title="Missing values",
                                description="What a row with a missing value gets: impute (as the model was "
                                            "trained), drop (left out and counted), fail, or model: impute where "
                                            "the model was trained with nan_policy 'impute', else drop"),
        "unseen_categories": Param(ScoreSpec.unseen_categories, type="string", enum=list(SCORE_UNSEEN_CATEGORIES),
                                   title="Unseen categories",
                                   description="What a category the model was not trained on gets: missing (scored "
                                               "as a missing value, as Missing values says, and counted as drift) "
                                               "or fail"),
    },
    tags=["ray", "ml", "example"],
    doc_md=__doc__,
) as dag:

    @task(doc_md="The promoted model of the triggering asset event, else the one `serve_app` serves now; "
                 "with the raw columns it needs.")
    def model_to_score(triggering_asset_events=None, params: dict | None = None) -> dict:
        from airflow_ray_ml.hooks.ray import RayHook
        from airflow_ray_ml.ray_score import served_model
        from airflow_ray_ml_stages import artifacts
        from airflow_ray_ml_stages.preprocessor import Preprocessor

        promoted = [dict(event.extra) for events in (triggering_asset_events or {}).values()
                    for event in events if event.extra and event.extra.get("model_dir")]
        app = (params or {})["serve_app"]
        model = promoted[-1] if promoted else {**served_model(RayHook(), app), "app": app}
        preprocessor = Preprocessor.load(artifacts.join(model["model_dir"], "preprocessor.json"))
        return {**model, "input_columns": preprocessor.input_columns}

    @task.branch(doc_md="Score the `input` Param's file; else generate new wines, if the model reads wines.")
    def pick_input(model: dict, params: dict | None = None, ti=None) -> list[str]:
        from airflow_ray_ml_stages import wine

        if (params or {}).get("input"):
            return ["scoring_input"]
        missing = [column for column in model["input_columns"] if column not in (*wine.FEATURES, wine.TYPE_COLUMN)]
        if missing:
            reason = (f"model {model['model_version']} needs column(s) {missing} that the "
                      "generated new wines lack; trigger this DAG with the `input` Param naming a file that has "
                      "them to score it")
            ti.xcom_push(key="skip_reason", value=reason)
            logging.getLogger(__name__).info("Skipping the scoring: %s", reason)
            return []
        return ["new_wines", "scoring_input"]

    model = model_to_score()
    new_wines = RayJobOperator(
        task_id="new_wines",
        stage="generate",
        spec={"rows": "{{ params.new_rows }}", "seed": "{{ params.new_seed }}", "file_format": "csv",
              "with_label": False, "name": "new_wines"},
        doc_md="Write seeded new wines (no quality grade) into this run's artifacts.",
    )

    @task(trigger_rule="none_failed_min_one_success",  # after new_wines, or straight after pick_input
          doc_md="The file to score: the `input` Param's, or the one `new_wines` wrote.")
    def scoring_input(generated: dict | None, params: dict | None = None) -> str:
        given = (params or {}).get("input")
        # a person's path: read, and written beside, only under the allowed sources
        return confine_sources(given)[0] if given else generated["data_uris"][0]

    chosen = scoring_input(new_wines.output)
    score = RayBatchScoreOperator(
        task_id="score",
        input_uri=chosen,
        model=model,
        missing_values="{{ params.missing_values }}",
        unseen_categories="{{ params.unseen_categories }}",
        drift_asset=DRIFT_ASSET,
        doc_md="Score the file with Ray Data; predictions and the drift report are written next to it; a file "
               "that drifted updates the drift Asset (the `retrain` task then retrains the served model).",
    )

    @task(doc_md="Where the file drifted: the DAG and Params of the run that trained the scored model, to run "
                 "again; skipped, with the reason, otherwise.")
    def retraining(scored: dict, model: dict, run_id=None, params: dict | None = None) -> dict:
        from airflow_ray_ml.compat import AirflowSkipException
        from airflow_ray_ml.drift_retrain import retraining_run
        from airflow_ray_ml.hooks.ray import RayHook

        # a person's paths: only under the allowed sources, refused before any run reads them
        new_data = confine_sources([line.strip() for line in (params or {}).get("retrain_with") or [] if line.strip()])
        plan, why = retraining_run(scored, model, RayHook().artifact_root, run_id, PIPELINE, new_data)
        logging.getLogger(__name__).info("%s", why)
        if plan is None:
            raise AirflowSkipException(why)
        return plan

    plan = retraining(score.output, model)
    DriftRetrainOperator(
        task_id="retrain",
        trigger_dag_id=PIPELINE,
        trigger_run_id=plan["run_id"],
        conf=plan["conf"],
        note=plan["note"],
        skip_when_already_exists=True,  # a retried task: the run it triggered runs already
        doc_md="Trigger the retraining run `retraining` planned, with its note.",
    )

    pick_input(model) >> [new_wines, chosen]
