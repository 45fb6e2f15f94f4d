"""Names and defaults that the Ray side and the Airflow side must agree on, kept in one place."""

MANIFEST_NAME = "manifest.json"
"""File name of the result manifest every stage writes into its artifact directory."""

MANIFEST_LOG_MARKER = "RAYML_MANIFEST "
"""Prefix of the job log line that repeats the manifest, for clusters whose artifact root the
Airflow worker cannot read."""

WAITING_NAME = "waiting.json"
"""File a stage writes beside its manifest while its trials or workers wait for the cluster's
resources: ``{"state": "pending" or "running", "what", "reason", "since"}``. The Ray ML page shows a
running job whose file says ``pending`` as pending, with the reason."""

TUNE_PROGRESS_MARKER = "tune progress: "
"""Prefix of the line a search logs about every ``TrialClock.PROGRESS_EVERY_S`` (trials ended,
running and waiting, the best metric so far): in the task log, and what `make run` repeats."""

TEST_PREDICTIONS_NAME = "test_predictions.json"
"""File in a model directory with the model's answer to every row of its test split, in the split's
order: ``{"task", "labels", "predictions"}`` (a value per row, or the class probabilities per row).
The deploy gate pairs them with the champion's answers to measure whether the challenger is better
beyond the test rows' noise."""

STATUS_SUCCEEDED = "succeeded"
STATUS_FAILED = "failed"

ARTIFACT_DIR_ENV = "RAYML_ARTIFACT_DIR"
"""Environment variable that gives a job of your own (RayJobOperator's ``entrypoint``) its task run's
artifact directory, where :func:`airflow_ray_ml_stages.job_result.report_result` writes its manifest."""

DEFAULT_ARTIFACT_ROOT_ENV = "RAYML_ARTIFACT_ROOT"
"""Environment variable naming the artifact root when neither the operator nor the connection does."""

JOB_ENV_VARS = {
    # Ray Train V2 polls its workers every 2 s by default and every report waits for a poll;
    # 0.1 s cuts 100 XGBoost rounds from 213 s to 22 s on a 2-CPU machine.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    # Ray Tune adds a TensorBoard logger beside its CSV and JSON ones unless told not to: importing
    # tensorboardX takes about 1.1 s of a tune job's CPU. The tune stage asks for the CSV and JSON
    # loggers itself (a trial's history is read from them); Ray's RAY_TUNE_CALLBACKS brings
    # TensorBoard back (docs/operators/tune.md).
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}
"""Environment every stage job gets in its runtime_env."""

SCALERS = ("standard", "minmax", "none")
"""The preprocessor's scalers: what a preprocess spec, a train config or a search space may name."""

ACCELERATOR_CHOICES = ("auto", "gpu", "cpu")
"""A train or tune spec's ``accelerator``: ``auto`` lets :func:`airflow_ray_ml_stages.device.choose_device` weigh
the work against the GPU; ``gpu`` and ``cpu`` override it."""

TASKS = ("regression", "classification")
"""What a pipeline predicts: a number (``regression``) or one of the label's classes (``classification``)."""


def task_of(classes: object) -> str:
    """The task of data (or a model) with these classes: a classification has them, a regression None."""
    return "regression" if classes is None else "classification"

TASK_METRICS: dict[str, dict[str, str]] = {
    "regression": {"rmse": "min", "mae": "min", "acc_0_5": "max", "acc_1_0": "max"},
    "classification": {"log_loss": "min", "accuracy": "max", "macro_f1": "max"},
}
"""Each task's metrics (what every evaluation reports) and whether lower or higher is better."""

DEFAULT_METRIC = {"regression": "rmse", "classification": "log_loss"}
"""The metric a search optimises and the deploy gate compares when none is named."""

# Values pyarrow's CSV reader turns into null in a float column (its default null_values): missing
# values, not non-numeric ones, in any column (a category's empty text as well).
NULL_TOKENS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                         "1.#QNAN", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null"})


def is_missing(value: object) -> bool:
    """Whether one raw value of a table is missing: null, NaN, or a text of :data:`NULL_TOKENS` (``""``,
    ``NA``, ...) with or without spaces around it, in a text column as in a numeric one."""
    return (value is None or (isinstance(value, float) and value != value)
            or (isinstance(value, str) and value.strip() in NULL_TOKENS))


NAN_POLICIES = ("fail", "drop", "impute")
"""What the data stage does with a row that has a missing (or NaN, infinite) value: fail the run,
drop the row (counted), or impute the features from the training split (rows without a label
are dropped)."""
