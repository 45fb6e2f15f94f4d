"""Wine quality: from raw measurements to a served model, on Ray, orchestrated by Airflow.

Each task runs one Ray-side stage as a Ray job on the cluster named by the ``ray_default``
connection (the embedded local cluster under ``make run``); the Airflow worker only submits,
follows and records. A retried task re-attaches to its running job (or reuses its result).

* ``probe`` decides GPU or CPU once for the whole run (a CUDA smoke test where GPUs are
  advertised; CPU with the reason otherwise) and sizes the workers so Ray Data keeps CPU headroom;
  its XCom is the compute spec that tuning, training and serving take.
* ``pick_data`` → ``demo_data`` writes the seeded stand-in for the UCI wine-quality files (red and
  white, semicolon-separated as published) unless the ``source`` Param names your files;
  ``data_files`` hands either on to ``preprocess``, the ``source`` Param's only if they lie under
  the allowed sources (the artifact root's ``data`` folder and the ``ray_default`` connection's
  ``allowed_sources``; docs/deployment.md#confined-sources).
* ``preprocess`` validates the files, splits them deterministically, fits the scalers on the
  train split only and writes Parquet splits, the preprocessor JSONs and a data profile.
* ``search_space`` turns the Params form (families, scalers, epochs, rounds) into the search
  space, unless the ``search_space`` Param gives a whole one.
* ``tune`` searches family × scaler × hyperparameters on Ray Tune with ASHA early stopping, on the
  validation split only; it writes a leaderboard (CSV, JSON) and a plot.
* ``train`` fits the best config (on the GPU when the probe found one and the table is large enough
  to run faster there, or as the ``accelerator`` Param says) and writes a model
  directory with its model card: test metrics (the test split's first use), data fingerprint,
  config, versions.
* ``deploy`` promotes the model to the Ray Serve endpoint only if it beats the model being served
  on the same test split; otherwise the task is skipped ("kept champion"). A failed deploy or
  smoke test restores the previous version. A promotion updates the ``wine_quality_model`` Asset,
  which schedules ``wine_batch_scoring``. Deploy Params left empty serve under the label's name
  (the demo's ``wine-quality`` at ``/wine``); a served model that cannot score this run's rows (a
  changed schema) is replaced or kept as ``on_schema_change`` says.

It runs weekly, with the Params' defaults (set ``source`` there to retrain on your own table), and
whenever ``wine_batch_scoring`` finds that a file it scored has drifted from the served model's
training data: then the run that trained the served model runs again, with that run's Params (its
source, label, task, settings, rollout and approval), and its note says why ("Started by drift in
alcohol (PSI 0.41), ..."). Drift never retrains on the defaults or on generated data the served
model was not trained on.

Results travel between tasks as XComArgs (``data=preprocess.output``, ``model=train.output``,
``config=tune.output["best_config"]``); Params arrive as templates, which the operators coerce to
their settings' types, so the DAG needs no ``render_template_as_native_obj``.

Trigger it from the UI to change the Params below.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, Param, task

from airflow_ray_ml.compat import CronTriggerTimetable
from airflow_ray_ml.confine import confine_sources
from airflow_ray_ml.gpu_probe import GPUProbeOperator
from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_job import RayJobOperator
from airflow_ray_ml.ray_serve import RayServeDeployOperator
from airflow_ray_ml.serve_gate import DEFAULT_MIN_CONFIDENCE
from airflow_ray_ml.serve_rollout import ROLLOUTS, Rollout
from airflow_ray_ml.serve_schema import DEFAULT_ON_SCHEMA_CHANGE, SCHEMA_CHANGE_POLICIES
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator
from airflow_ray_ml_stages.constants import ACCELERATOR_CHOICES, NAN_POLICIES, SCALERS, TASKS
from airflow_ray_ml_stages.folds import ENOUGH_CLASS_ROWS, ENOUGH_VALIDATION_ROWS
from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE, search_space_json_schema
from airflow_ray_ml_stages.specs import (
    PLACEMENT_STRATEGIES,
    SEARCHERS,
    PreprocessSpec,
    ProbeSpec,
    TrainSpec,
    TuneSpec,
)
from airflow_ray_ml_stages.train.config import FAMILIES
from airflow_ray_ml_stages.wine import LABEL, QUALITY_RANGE, serve_endpoint

DEMO_ROWS = 6497  # the size of the published data set
DEMO_SEED = 7
# Weekly by default. `make run` sets WINE_PIPELINE_SCHEDULE=none, so unpausing the DAG for the demo
# does not also start the latest scheduled run next to the one it triggers.
SCHEDULE = os.environ.get("WINE_PIPELINE_SCHEDULE", "@weekly")
# Updated by `deploy` only when it promotes a model; its event carries the model's URI, version and
# test metrics. dags/wine_batch_scoring.py is scheduled on it.
WINE_MODEL = Asset("wine_quality_model")

DOCS = "https://github.com/airflow-ray-ml/airflow-ray-ml/blob/main/docs"
# JSON cannot carry infinity, and the data stage takes a range as two numbers: a bound left empty
# is the largest float on its side.
NO_BOUND = sys.float_info.max
RANGE_HELP = (f"Both empty: no check on your data, {list(QUALITY_RANGE)} on the demo data; one empty: no "
              "bound on that side. Given the wrong way round, the two are swapped.")
SEARCH_SPACE_EXAMPLE = {"family": "xgboost", "scaler": "standard",
                        "xgboost": {"max_depth": {"randint": [3, 9]}, "eta": {"loguniform": [0.02, 0.3]},
                                    "num_boost_round": 200}}
SEARCH_SPACE_HELP = (
    "A whole search space; it replaces *Model families*, *Scalers*, *Lightning epochs* and *XGBoost "
    f"rounds*. Empty: built from those. Example: `{json.dumps(SEARCH_SPACE_EXAMPLE)}`. "
    f"The format: [search space]({DOCS}/operators/tune.md#search-space)."
)


def data_sources(params: dict) -> list[str]:
    """The ``source`` Param's files: the form sends one per line, blank lines included."""
    return [line.strip() for line in params.get("source") or [] if line and line.strip()]


def label_range(params: dict) -> list[float] | None:
    """``[low, high]`` for the data stage from the ``label_min`` and ``label_max`` Params.

    Each Param is checked on its own when a run is triggered, so every pair the form can send
    must mean something: bounds given the wrong way round are swapped, a missing one is no bound.
    """
    low, high = params.get("label_min"), params.get("label_max")
    if low is None and high is None:  # the wine grades' range only where the data is the demo's
        return None if data_sources(params) else list(QUALITY_RANGE)
    low = -NO_BOUND if low is None else low
    high = NO_BOUND if high is None else high
    return [min(low, high), max(low, high)]


def deploy_endpoint(params: dict) -> dict:
    """``{"app", "route"}`` for the deploy task: the Deploy Params where given; left empty, the
    application is named after the label, as under ``make run LABEL=`` (``serve_endpoint``), so a
    run on another table from the form never deploys over the wine model. A route left empty is
    ``/<app>`` (the operator's rule)."""
    app, route = params.get("serve_app"), params.get("serve_route")
    if not app:
        app, derived_route = serve_endpoint(params.get("label_column"))
        route = route or derived_route
    return {"app": app, "route": route or ""}


with DAG(
    dag_id="wine_quality_pipeline",
    description="Probe, preprocess, train and serve a wine-quality model on Ray",
    # drift retrains through wine_batch_scoring's `retrain` task, with the served model's own Params
    schedule=None if SCHEDULE.lower() == "none" else CronTriggerTimetable(SCHEDULE, timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    # every Ray job's id names the label it trains for: airflow-wine-quality-pipeline-<label>-<task>-<hash>
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "job_name": "{{ params.label_column }}"},
    params={
        # No section: Airflow's trigger form opens these (its default section); the named sections
        # below start collapsed.
        "source": Param(
            None, type=["null", "array"], items={"type": "string"}, title="Data files",
            description="Your CSV or Parquet files or URLs, one per line (blank lines are ignored), "
                        "under the allowed sources (the artifact root's data folder, and the ray_default "
                        "connection's allowed_sources). Empty: the generated demo data."),
        "label_column": Param(LABEL, type="string", pattern=r"\S", title="Label column",
                              description="The column to predict"),
        "task": Param(PreprocessSpec.task, type="string", enum=list(TASKS), title="Task",
                      description="regression: predict the label's value; classification: predict its class "
                                  "(each label value is a class, or two with Class threshold)"),
        "label_threshold": Param(None, type=["null", "number"], title="Class threshold",
                                 description="Classification only: two classes, 1 where the label is at least "
                                             "this and 0 below (7 on the demo: good wine); empty: the label's "
                                             "values are the classes"),
        "label_min": Param(None, type=["null", "number"], title="Lowest label",
                           description=f"Labels below it fail the run. {RANGE_HELP}"),
        "label_max": Param(None, type=["null", "number"], title="Highest label",
                           description="Labels above it fail the run (see Lowest label)"),
        "drop_columns": Param([], type="array", uniqueItems=True, items={"type": "string", "minLength": 1},
                              title="Columns to leave out", section="Data cleaning",
                              description="Columns of your files that are not features (ids, free text, a "
                                          "column derived from the label), one per line"),
        "nan_policy": Param(PreprocessSpec.nan_policy, type="string", enum=list(NAN_POLICIES),
                            title="Missing values", section="Data cleaning",
                            description="impute: a feature's missing (empty, NA, NaN or infinite) value becomes "
                                        "the training split's median or most frequent value, and the served "
                                        "model imputes the same way; a row without a label is left out and "
                                        "counted. fail: such a value fails the run. drop: its row is left out "
                                        "and counted"),
        "max_categories": Param(PreprocessSpec.max_categories, type="integer", minimum=1, maximum=100_000,
                                title="Most categories", section="Data cleaning",
                                description="A text column with more distinct training values fails the run "
                                            "(leave it out, or raise this)"),
        "families": Param(list(FAMILIES), type="array", minItems=1, uniqueItems=True,
                          items={"type": "string", "enum": list(FAMILIES)},
                          examples=list(FAMILIES),  # what makes the form a multi-select
                          title="Model families",
                          description="Model families to search, at least one: a Lightning MLP, XGBoost, and "
                                      "scikit-learn's ExtraTrees, random forest and linear model (CPU)"),
        "scalers": Param(list(DEFAULT_SEARCH_SPACE["scaler"]["choice"]), type="array", minItems=1,
                         uniqueItems=True, items={"type": "string", "enum": list(SCALERS)}, examples=list(SCALERS),
                         title="Scalers", description="Feature scalings to search; the first is the one "
                                                      "the data is written with"),
        "num_trials": Param(12, type="integer", minimum=1, maximum=1000, title="Trials",
                            description="Tune trials; where a weighted average of the completed ones beats each "
                                        "of them on validation, that ensemble is the champion"),
        "deploy": Param(True, type="boolean", title="Deploy if better",
                        description="Promote the model to Ray Serve if it beats the served one"),
        "searcher": Param(TuneSpec.searcher, type="string", enum=list(SEARCHERS), title="Searcher",
                          section="Search", description="adaptive: random hyperparameters, most trials for the family "
                                                         "that is winning; random search; or Optuna's TPE"),
        "cv_folds": Param(TuneSpec.cv_folds, type="integer", minimum=0, maximum=20, title="Cross-validation folds",
                          section="Search", **{"not": {"const": 1}},
                          description="Where the validation split is too small to rank trials by (under "
                                      f"{ENOUGH_VALIDATION_ROWS} rows, or {ENOUGH_CLASS_ROWS} of a class), each trial "
                                      "trains this many fold models and is ranked out of fold; 0: never"),
        "time_budget_s": Param(900, type=["null", "number"], minimum=10, title="Time budget (s)", section="Search",
                               description="Stop the search after this many seconds; empty: no limit"),
        "max_epochs": Param(30, type="integer", minimum=1, maximum=1000, title="Lightning epochs",
                            section="Search", description="Epochs per Lightning trial"),
        "num_boost_round": Param(1000, type="integer", minimum=1, maximum=10000, title="XGBoost rounds",
                                 section="Search", description="Boosting rounds per XGBoost trial"),
        # checked when the run is triggered, values included: the schema states SearchSpace's rules
        "search_space": Param(None, **{**search_space_json_schema(), "type": ["null", "object"]},
                              title="Search space (JSON)", section="Search", description_md=SEARCH_SPACE_HELP),
        "train_workers": Param(None, type=["null", "integer"], minimum=0, maximum=512, title="Training workers",
                               section="Training",
                               description="Ray Train workers (0: train inside the job); empty: sized from the data"),
        "placement_strategy": Param(TrainSpec.placement_strategy, type="string", enum=list(PLACEMENT_STRATEGIES),
                                    title="Worker placement", section="Training",
                                    description="How training workers are placed on the cluster's nodes"),
        # empty (null from the form, "" from a cleared field): named after the label (deploy_endpoint)
        "serve_app": Param(None, type=["null", "string"], pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})?$",
                           title="Serve application", section="Deploy",
                           description="The Ray Serve application the model is promoted to (one per model): "
                                       "letters, digits, '.', '_', '-'. Empty: named after the label column "
                                       "(wine-quality for the demo's quality, rent for rent)"),
        "serve_route": Param(None, type=["null", "string"], pattern=r"^(/([A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*)?)?$",
                             title="Endpoint route", section="Deploy",
                             description="The endpoint's path, starting with '/': predictions at "
                                         "<serve URL><route>/predict. Empty: '/' and the application's name "
                                         "(/wine for wine-quality)"),
        "on_schema_change": Param(DEFAULT_ON_SCHEMA_CHANGE, type="string", enum=list(SCHEMA_CHANGE_POLICIES),
                                  title="On a schema change", section="Deploy",
                                  description="When the served model cannot score this run's test rows (columns "
                                              "missing or new, another label, other classes or task): promote "
                                              "this model, or refuse it and keep the served one"),
        "rollout": Param(Rollout.mode, type="string", enum=list(ROLLOUTS), title="Rollout", section="Deploy",
                         description="How a model that passed the gate meets live traffic before it is promoted: "
                                     "direct (at once), shadow (a share of requests is mirrored to it, clients get "
                                     "the served model's answers) or canary (a share is answered by it); a shadow "
                                     "or canary that fails or is slower rolls back or keeps the served model"),
        "rollout_share": Param(None, type=["null", "number"], exclusiveMinimum=0, maximum=1, title="Rollout share",
                               section="Deploy", description="The share of requests the challenger gets in shadow "
                               "or canary (0.1: one in ten). Empty: all of them in shadow, one in ten in canary"),
        "rollout_labels": Param(None, type=["null", "string"], title="Labels of live rows", section="Deploy",
                                description="A CSV or Parquet file of rows clients sent, with the label known later "
                                            "(every input column and the label): in shadow, both models are scored "
                                            "on the mirrored rows it labels. Under the allowed sources"),
        "approval": Param(False, type="boolean", title="Ask for approval", section="Deploy",
                          description="Ask a person to approve the promotion in Airflow's Required actions, with "
                                      "the test metrics, the live trial and the drift that started the run"),
        "min_improvement": Param(0.0, type="number", minimum=0, title="Minimum improvement", section="Deploy",
                                 description="How much better the test metric (RMSE, or log loss for "
                                             "classification) must be to replace the served model"),
        "min_confidence": Param(DEFAULT_MIN_CONFIDENCE, type="number", minimum=0, exclusiveMaximum=1,
                                title="Confidence the model is better", section="Deploy",
                                description="The share of resamples of the test rows in which the new model must "
                                            "beat the served one (a paired bootstrap: a difference within the "
                                            "rows' noise keeps the served model). 0: any better metric promotes"),
        "require_gpu": Param(False, type="boolean", title="Require a GPU", section="Compute",
                             description="Fail instead of falling back to CPU"),
        "accelerator": Param(TrainSpec.accelerator, type="string", enum=list(ACCELERATOR_CHOICES), title="Accelerator",
                             section="Compute",
                             description="auto: the GPU only for work large enough to run faster there (a small "
                                         "table trains faster on CPU); gpu: the GPU whenever the probe found one; "
                                         "cpu: never the GPU"),
        "wait_for_gpu_s": Param(ProbeSpec.wait_for_gpu_s, type="number", minimum=0, maximum=3600,
                                title="Wait for a GPU (s)", section="Compute",
                                description="On autoscaling clusters: seconds to wait for a GPU node"),
        "demo_rows": Param(DEMO_ROWS, type="integer", minimum=100, maximum=10_000_000, title="Demo rows",
                           section="Demo data", description="Rows of generated demo data (when no data files "
                                                            "are given)"),
        "demo_seed": Param(DEMO_SEED, type="integer", minimum=0, title="Demo seed", section="Demo data",
                           description="Seed of the demo data"),
    },
    user_defined_macros={"label_range": label_range, "deploy_endpoint": deploy_endpoint},
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

    @task.branch(doc_md="Use the `source` Param's files when given; generate the demo data otherwise.")
    def pick_data(params: dict | None = None) -> list[str]:
        return ["data_files"] if data_sources(params or {}) else ["demo_data", "data_files"]

    @task(trigger_rule="none_failed_min_one_success",  # after demo_data, or straight after pick_data
          doc_md="The files to preprocess: the `source` Param's, confined to the allowed sources, or the "
                 "ones `demo_data` wrote.")
    def data_files(generated: dict | None, params: dict | None = None) -> list[str]:
        # A person filling the form may name any path or URL: refused here, before a job reads it.
        return confine_sources(data_sources(params or {})) or list(generated["data_uris"])

    files = data_files(demo_data.output)
    preprocess = RayDataPreprocessOperator(
        task_id="preprocess",
        source=files,
        label_column="{{ params.label_column }}",
        task="{{ params.task }}",
        label_threshold="{{ params.label_threshold }}",
        scaler="{{ params.scalers[0] }}",
        label_range="{{ label_range(params) }}",  # the DAG's macro, from label_min and label_max
        drop_columns="{{ params.drop_columns }}",
        nan_policy="{{ params.nan_policy }}",
        max_categories="{{ params.max_categories }}",
        doc_md="Validate, split and scale the data (pyarrow in the job, or Ray Data across the cluster); "
               "the XCom lists the splits and the preprocessor.",
    )

    @task(doc_md="The search space from the Params form, or the `search_space` Param as given.")
    def search_space(params: dict | None = None) -> dict:
        from airflow_ray_ml.compat import AirflowFailException
        from airflow_ray_ml_stages.errors import SpecError
        from airflow_ray_ml_stages.search_space import SearchSpace, default_search_space

        params = params or {}
        if params.get("search_space"):
            try:
                SearchSpace(params["search_space"])
            except SpecError as err:  # the same space fails the same way: no retries
                raise AirflowFailException(f"the search_space Param: {err}") from None
            return params["search_space"]
        return default_search_space(params.get("families"), params.get("scalers"),
                                    params.get("max_epochs"), params.get("num_boost_round"))

    tune = RayTuneOperator(
        task_id="tune",
        data=preprocess.output,
        search_space=search_space(),
        compute=probe.output,
        num_samples="{{ params.num_trials }}",
        time_budget_s="{{ params.time_budget_s }}",
        searcher="{{ params.searcher }}",
        cv_folds="{{ params.cv_folds }}",
        accelerator="{{ params.accelerator }}",
        doc_md="Search family x scaler x hyperparameters with ASHA; the XCom has the best config and "
               "the leaderboard, which the UI's Ray ML page shows.",
    )
    train = RayTrainOperator(
        task_id="train",
        data=preprocess.output,  # splits, columns, preprocessor(s), fingerprint
        config=tune.output["best_config"],  # family, scaler and hyperparameters
        compute=probe.output,
        num_workers="{{ params.train_workers }}",
        placement_strategy="{{ params.placement_strategy }}",
        accelerator="{{ params.accelerator }}",
        doc_md="Train the best config on Ray Train; the XCom holds the model directory, its version and "
               "test metrics.",
    )

    @task.short_circuit(doc_md="Skip the deploy when the run's `deploy` Param is off.")
    def deploy_enabled(params: dict | None = None) -> bool:
        return bool((params or {}).get("deploy", True))

    deploy = RayServeDeployOperator(
        task_id="deploy",
        model=train.output,
        data=preprocess.output,  # the test split and the preprocessor that wrote it
        compute=probe.output,
        min_improvement="{{ params.min_improvement }}",
        min_confidence="{{ params.min_confidence }}",
        on_schema_change="{{ params.on_schema_change }}",
        rollout="{{ params.rollout }}",
        rollout_share="{{ params.rollout_share }}",
        rollout_labels="{{ params.rollout_labels }}",
        approval="{{ params.approval }}",
        app_name="{{ deploy_endpoint(params)['app'] }}",  # the DAG's macro, from serve_app and the label
        route_prefix="{{ deploy_endpoint(params)['route'] }}",
        outlets=[WINE_MODEL],
        doc_md="Promote the model to Ray Serve if it beats the served one; roll back on failure.",
    )

    pick_data() >> [demo_data, files]
    train >> deploy_enabled() >> deploy
