"""Stage specs and results: dataclasses that travel as JSON between Airflow and Ray.

Every spec validates itself in ``__post_init__`` and quotes the bad value, so a mistake in a DAG is
reported before any Ray job starts. ``to_dict``/``from_dict`` round-trip through plain JSON types.

What the specs build on lives beside them: the JSON round-trip and the field checks in
:mod:`airflow_ray_ml_stages.spec_base`, the train config's defaults and their validation in
:mod:`airflow_ray_ml_stages.train.config` (re-exported here), the search space's schema in :mod:`airflow_ray_ml_stages.search_space`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from airflow_ray_ml_stages.constants import (ACCELERATOR_CHOICES, DEFAULT_METRIC, NAN_POLICIES, SCALERS,
                                            TASK_METRICS, TASKS, task_of)
from airflow_ray_ml_stages.errors import SpecError
from airflow_ray_ml_stages.spec_base import (
    JsonDataclass, is_number, require_choice, require_int_range, require_non_empty, require_positive,
)
# The train stage's config: TrainSpec checks its config with resolve_train_config, and the
# family defaults are the documented place to look them up (airflow_ray_ml_stages.specs.LIGHTNING_DEFAULTS).
from airflow_ray_ml_stages.train.config import LIGHTNING_DEFAULTS, XGBOOST_DEFAULTS, resolve_train_config  # noqa: F401


@dataclasses.dataclass
class StageSpec(JsonDataclass):
    """Fields every stage spec has.

    :param artifact_dir: URI of this task run's directory (``<root>/<dag>/<run>/<task>``); the
        stage writes its outputs and ``manifest.json`` there.
    """

    stage: ClassVar[str] = ""
    artifact_dir: str

    def __post_init__(self) -> None:
        require_non_empty(type(self).__name__, "artifact_dir", self.artifact_dir)


@dataclasses.dataclass
class GenerateSpec(StageSpec):
    """Spec of the ``generate`` stage, which writes the demo wine-quality data set.

    :param rows: total number of rows (red and white together, in the UCI proportion).
    :param seed: random seed; the same seed gives the same file.
    :param file_format: ``uci`` (semicolon-separated with quoted header, as published),
        ``csv`` (comma-separated) or ``parquet``.
    :param with_label: False leaves the ``quality`` column out: new wines to score.
    :param name: the file name (without suffix) for ``csv`` and ``parquet``.
    """

    stage: ClassVar[str] = "generate"
    rows: int = 6497
    seed: int = 7
    file_format: str = "uci"
    with_label: bool = True
    name: str = "winequality"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int_range("GenerateSpec", "rows", self.rows, 2)
        require_int_range("GenerateSpec", "seed", self.seed, 0)
        require_choice("GenerateSpec", "file_format", self.file_format, ("uci", "csv", "parquet"))
        if not isinstance(self.with_label, bool):
            raise SpecError(f"GenerateSpec.with_label must be true or false, got {self.with_label!r}")
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            raise SpecError(f"GenerateSpec.name must be a plain file name (letters, digits, _ . -), got {self.name!r}")


@dataclasses.dataclass
class GenerateResult(JsonDataclass):
    data_uris: list[str]
    rows: int
    rows_by_type: dict[str, int]
    fingerprint: str


ACCELERATORS = ("gpu", "cpu")


@dataclasses.dataclass
class ComputeSpec(JsonDataclass):
    """How training, tuning and serving run: decided once per Airflow run by the GPU probe.

    :param use_gpu: whether workers get GPUs.
    :param gpus_per_worker: GPUs each worker requests (0 on CPU).
    :param num_workers: the most workers the cluster supports; stages may use fewer for small data.
    :param cpus_per_worker: CPUs each worker requests; sized to leave Ray Data CPU headroom.
    :param accelerator: the PyTorch Lightning accelerator, ``gpu`` or ``cpu``.
    :param devices: the GPUs found: node, name, memory (GiB) and whether CUDA could use them.
    :param reason: why this was decided, in one human sentence.
    :param cluster: what the probe saw: nodes, CPUs and GPUs in total.
    :param decided_in_s: how long the decision took.
    """

    use_gpu: bool
    gpus_per_worker: float
    num_workers: int
    cpus_per_worker: float
    accelerator: str
    reason: str
    devices: list[dict] = dataclasses.field(default_factory=list)
    cluster: dict = dataclasses.field(default_factory=dict)
    decided_in_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.use_gpu, bool):
            raise SpecError(f"ComputeSpec.use_gpu must be true or false, got {self.use_gpu!r}")
        require_int_range("ComputeSpec", "num_workers", self.num_workers, 1)
        require_choice("ComputeSpec", "accelerator", self.accelerator, ACCELERATORS)
        require_positive("ComputeSpec", "cpus_per_worker", self.cpus_per_worker)
        require_positive("ComputeSpec", "gpus_per_worker", self.gpus_per_worker, or_zero=True)
        if self.use_gpu != (self.gpus_per_worker > 0) or self.use_gpu != (self.accelerator == "gpu"):
            raise SpecError(
                "ComputeSpec is inconsistent: use_gpu, gpus_per_worker > 0 and accelerator == 'gpu' "
                f"must agree, got use_gpu={self.use_gpu!r}, gpus_per_worker={self.gpus_per_worker!r}, "
                f"accelerator={self.accelerator!r}"
            )

    @classmethod
    def cpu(cls, reason: str, num_workers: int = 1, cpus_per_worker: float = 1.0, **fields: Any) -> "ComputeSpec":
        return cls(use_gpu=False, gpus_per_worker=0, num_workers=num_workers,
                   cpus_per_worker=cpus_per_worker, accelerator="cpu", reason=reason, **fields)

    def summary(self) -> str:
        """The decision as one readable line (the task log shows this)."""
        where = (
            f"GPU: {self.num_workers} worker(s) x {self.gpus_per_worker:g} GPU + {self.cpus_per_worker:g} CPU"
            if self.use_gpu
            else f"CPU: {self.num_workers} worker(s) x {self.cpus_per_worker:g} CPU"
        )
        return f"{where} - {self.reason} (decided in {self.decided_in_s:.2f} s)"


def default_compute() -> dict[str, Any]:
    """The compute spec a stage uses when it is given none: one CPU worker."""
    return ComputeSpec.cpu("default: no compute spec given").to_dict()


@dataclasses.dataclass
class ProbeSpec(StageSpec):
    """Spec of the ``probe`` stage: check advertised GPUs with a real CUDA smoke test.

    :param wait_for_gpu_s: on autoscaling clusters, ask for a GPU and wait up to this long.
    :param smoke_timeout_s: how long the CUDA smoke test may take once a GPU is placed.
    :param max_workers: the most training workers to plan for.
    """

    stage: ClassVar[str] = "probe"
    wait_for_gpu_s: float = 0.0
    smoke_timeout_s: float = 60.0
    max_workers: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("wait_for_gpu_s", "smoke_timeout_s"):
            require_positive("ProbeSpec", name, getattr(self, name), or_zero=True, unit="seconds")
        require_int_range("ProbeSpec", "max_workers", self.max_workers, 1)


DELIMITERS = ("auto", ",", ";", "\t")
FILE_FORMATS = ("auto", "csv", "parquet")
ENGINES = ("auto", "direct", "ray_data")
"""How a data stage (preprocess, score) reads its input: pyarrow in the job's driver, Ray Data's
tasks, or ``auto``, which picks by the input's size (``direct_max_bytes``)."""
DIRECT_MAX_BYTES = 2 * 1024**3
"""The default input size up to which a stage works in its job's driver rather than start Ray Data."""


def _require_str_list(owner: str, name: str, value: Any, allow_none: bool = True, allow_empty: bool = True) -> None:
    if value is None and allow_none:
        return
    if (
        not isinstance(value, list)
        or any(not isinstance(item, str) or not item.strip() for item in value)
        or (not allow_empty and not value)
    ):
        what = "a list of non-empty strings" + ("" if allow_empty else " with at least one item")
        raise SpecError(f"{owner}.{name} must be {what}, got {value!r}")
    duplicates = sorted({item for item in value if value.count(item) > 1})
    if duplicates:
        raise SpecError(f"{owner}.{name} names {duplicates} more than once, got {value!r}")


def _require_label_column(owner: str, value: Any) -> None:
    """``label_column`` has no default: the library knows no table, so the caller names the label."""
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{owner}.label_column is required: the column to predict (label_column='<column>'); "
                        f"got {value!r}")


@dataclasses.dataclass
class PreprocessSpec(StageSpec):
    """Spec of the ``data`` stage: validate, split, fit a scaler on the train split, write Parquet.

    :param source: the input files: CSV (comma, or the UCI semicolon layout) or Parquet; local
        paths, ``file://``, ``s3://``, ``gs://`` or ``http(s)://``. Files read together share a schema.
    :param label_column: the column to predict; required (no default).
    :param task: ``regression`` (a numeric label, predicted as a number) or ``classification``
        (integer or text labels, each value a class; the splits hold each row's class index and
        the preprocessor lists the classes; the split is stratified by class).
    :param label_threshold: classification only: two classes from a numeric label, ``1`` where
        the label is at least this and ``0`` below (e.g. 7 for "good" wine grades); None: the
        label's own values are the classes.
    :param feature_columns: input columns used as features; None: every column but the label and
        ``drop_columns``. When given, any other column (except the label and ``drop_columns``) is
        an error, so a changed input schema is noticed.
    :param categorical_columns: feature columns one-hot encoded; None: the feature columns whose
        values in the first rows of the first file are all non-numeric (the wine ``type``), but for
        boolean ones. A boolean column (its first values all true/false or yes/no, any case, or a
        Parquet boolean column) is one 0/1 input, not scaled; list it here to one-hot encode it instead.
    :param drop_columns: columns present in the input but not used.
    :param split: fractions ``[train, validation, test]``, each >= 0, summing to 1, train > 0.
    :param seed: the split seed: a row's split is a seeded hash of its content; every seed splits every
        table differently, and seed 0 is pandas' row hash unchanged.
    :param scaler: ``standard`` (mean, population std), ``minmax`` or ``none``.
    :param nan_policy: what a NaN, infinite or missing value (empty or ``NA`` text too) gets: ``impute``
        (a feature's becomes the training split's median, or most frequent category, saved in the
        preprocessor so serving and scoring impute alike; a row without a label is dropped and
        counted), ``drop`` (its row is left out and counted) or ``fail`` (the run fails naming it).
    :param label_range: ``[low, high]``: labels outside it are an error; None: no check.
    :param delimiter: CSV delimiter, ``auto`` to detect it from each file's header.
    :param file_format: ``auto`` (Parquet by suffix ``.parquet``/``.pq``, CSV otherwise), ``csv``
        or ``parquet``.
    :param max_categories: a categorical column with more distinct training values is an error.
    :param override_num_blocks: Ray Data read parallelism; None: one block (one fused task) per file. The output does not
        depend on it.
    :param engine: ``direct`` (pyarrow in the job's driver, streaming with its node's cores),
        ``ray_data`` (Ray Data tasks across the cluster) or ``auto``: direct when the input is at
        most ``direct_max_bytes`` or the cluster has one node, Ray Data otherwise. The output does
        not depend on it.
    :param direct_max_bytes: input size up to which ``auto`` runs in the driver without asking the cluster.
    """

    stage: ClassVar[str] = "data"
    source: list[str] = dataclasses.field(default_factory=list)
    label_column: str = ""  # required: the empty default only keeps the field order valid
    task: str = "regression"
    label_threshold: float | None = None
    feature_columns: list[str] | None = None
    categorical_columns: list[str] | None = None
    drop_columns: list[str] = dataclasses.field(default_factory=list)
    split: list[float] = dataclasses.field(default_factory=lambda: [0.7, 0.15, 0.15])
    seed: int = 0
    scaler: str = "standard"
    nan_policy: str = "impute"
    label_range: list[float] | None = None
    delimiter: str = "auto"
    file_format: str = "auto"
    max_categories: int = 100
    override_num_blocks: int | None = None
    engine: str = "auto"
    direct_max_bytes: int = DIRECT_MAX_BYTES

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "PreprocessSpec"
        if isinstance(self.source, str):  # one URI is a list of one
            self.source = [self.source]
        _require_str_list(owner, "source", self.source, allow_none=False, allow_empty=False)
        _require_label_column(owner, self.label_column)
        require_choice(owner, "task", self.task, TASKS)
        if self.label_threshold is not None:
            if not is_number(self.label_threshold):
                raise SpecError(f"{owner}.label_threshold must be a finite number or null, got {self.label_threshold!r}")
            if self.task != "classification":
                raise SpecError(f"{owner}.label_threshold makes two classes of the label: it needs "
                                f"task='classification', got task={self.task!r}")
        _require_str_list(owner, "feature_columns", self.feature_columns)
        if self.feature_columns is not None and not self.feature_columns:
            raise SpecError(f"{owner}.feature_columns must name at least one column or be null, got []")
        _require_str_list(owner, "categorical_columns", self.categorical_columns)
        _require_str_list(owner, "drop_columns", self.drop_columns, allow_none=False)
        for name in ("feature_columns", "categorical_columns", "drop_columns"):
            if self.label_column in (getattr(self, name) or []):
                raise SpecError(f"{owner}.{name} must not contain the label column {self.label_column!r}")
        if self.feature_columns is not None and self.categorical_columns is not None:
            stray = sorted(set(self.categorical_columns) - set(self.feature_columns))
            if stray:
                raise SpecError(f"{owner}.categorical_columns {stray} are not in feature_columns {self.feature_columns!r}")
        overlap = sorted(set(self.drop_columns) & set(self.feature_columns or []))
        if overlap:
            raise SpecError(f"{owner}: columns {overlap} are both features and dropped")
        if (
            not isinstance(self.split, list)
            or len(self.split) != 3
            or not all(is_number(part) and part >= 0 for part in self.split)
            or abs(sum(self.split) - 1.0) > 1e-9
            or self.split[0] <= 0
        ):
            raise SpecError(
                f"{owner}.split must be [train, validation, test] fractions >= 0 summing to 1 with "
                f"train > 0, got {self.split!r}"
            )
        require_int_range(owner, "seed", self.seed, 0)
        require_choice(owner, "scaler", self.scaler, SCALERS)
        require_choice(owner, "nan_policy", self.nan_policy, NAN_POLICIES)
        require_choice(owner, "delimiter", self.delimiter, DELIMITERS)
        require_choice(owner, "file_format", self.file_format, FILE_FORMATS)
        require_int_range(owner, "max_categories", self.max_categories, 1)
        if self.override_num_blocks is not None:
            require_int_range(owner, "override_num_blocks", self.override_num_blocks, 1)
        require_choice(owner, "engine", self.engine, ENGINES)
        require_int_range(owner, "direct_max_bytes", self.direct_max_bytes, 0)
        if self.label_range is not None and (
            not isinstance(self.label_range, list)
            or len(self.label_range) != 2
            or not all(is_number(bound) for bound in self.label_range)
            or self.label_range[0] > self.label_range[1]
        ):
            raise SpecError(f"{owner}.label_range must be [low, high] numbers with low <= high, got {self.label_range!r}")


@dataclasses.dataclass
class PreprocessResult(JsonDataclass):
    """What the ``data`` stage wrote: the manifest returned as the XCom.

    ``split_uris`` maps ``train``/``validation``/``test`` to Parquet directories (an empty split
    has no directory and maps to None); ``preprocessor_uri`` is the fitted preprocessor's JSON (the
    scaling the splits were written with), ``preprocessor_variants`` maps every scaler
    (``standard``, ``minmax``, ``none``) to a preprocessor fitted on the same training statistics,
    so tuning and training can switch scalers without refitting; ``profile_uri`` the data profile.
    ``task`` is the spec's; ``classes`` (classification only) the label's classes in the order of
    the class indexes the splits hold.
    """

    split_uris: dict[str, str | None]
    preprocessor_uri: str
    profile_uri: str
    rows: dict[str, int]
    rows_read: int
    rows_dropped: int
    feature_columns: list[str]
    label_column: str
    fingerprint: str
    preprocessor_variants: dict[str, str] = dataclasses.field(default_factory=dict)
    task: str = "regression"
    classes: list[Any] | None = None


def require_classes(owner: str, classes: Any) -> None:
    """``classes``: None (regression), or the classification's two or more distinct classes."""
    if classes is None:
        return
    if (not isinstance(classes, list) or len(classes) < 2
            or any(isinstance(value, bool) or not isinstance(value, (int, str)) for value in classes)
            or len(set(classes)) != len(classes)):
        raise SpecError(f"{owner}.classes must be null (regression) or a list of two or more distinct integer or "
                        f"text classes, as the preprocess manifest gives them, got {classes!r:.200}")


def require_variants(owner: str, variants: Any) -> None:
    """``preprocessor_variants``: None or ``{scaler: non-empty URI}``."""
    if variants is None:
        return
    if not isinstance(variants, dict) or any(
        scaler not in SCALERS or not isinstance(uri, str) or not uri for scaler, uri in variants.items()
    ):
        raise SpecError(f"{owner}.preprocessor_variants must map scalers {list(SCALERS)} to URIs, got {variants!r}")


@dataclasses.dataclass(frozen=True)
class FromPreprocess:
    """Where a spec field's value is in a preprocess task's XCom (a :class:`PreprocessResult` as a dict).

    :param path: the keys leading to it (``("split_uris", "train")``).
    :param optional: a None (or absent) value there is the field's value: the data has none (a
        regression has no classes). For the other fields it means the XCom is not a whole manifest.
    """

    path: tuple[str, ...]
    optional: bool = False


_FROM_PREPROCESS = "from_preprocess"


def from_preprocess(*path: str, default: Any = None, default_factory: Any = None, optional: bool = False) -> Any:
    """A spec field whose value an operator takes from the preprocess XCom at ``path``."""
    metadata = {_FROM_PREPROCESS: FromPreprocess(path, optional)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def preprocessed_fields(spec_type: type) -> dict[str, FromPreprocess]:
    """The fields of ``spec_type`` that come from a preprocess task's XCom, in field order, with where each is."""
    return {field.name: field.metadata[_FROM_PREPROCESS] for field in dataclasses.fields(spec_type)
            if _FROM_PREPROCESS in field.metadata}


@dataclasses.dataclass
class PreprocessedData(StageSpec):
    """The preprocessed data a model stage reads: the fields and checks TuneSpec and TrainSpec share.

    Each field names where it is in the preprocess manifest (:func:`from_preprocess`), so the
    operators fill them from ``data=preprocess.output`` (:func:`preprocessed_fields`), and the JSON
    keeps them flat beside the stage's own fields.

    :param train_uri: the preprocessed training split (Parquet file or directory).
    :param validation_uri: the validation split: early stopping, the validation metrics, and the
        score every tune trial is ranked by.
    :param feature_columns: the feature columns, in the order the models take them.
    :param label_column: the column to predict; required (no default).
    :param classes: classification: the label's classes from the preprocess manifest (the splits
        hold class indexes into them); None: regression.
    :param preprocessor_uri: the preprocessor the splits were written with (its JSON), copied
        unchanged into the model directory; None: the data is used as written, and no config or
        search space may ask for a scaler.
    :param preprocessor_variants: ``{scaler: preprocessor JSON URI}`` from the preprocess manifest:
        the scalers a config may name instead of ``preprocessor_uri``'s; the features are mapped to
        it exactly (affine, no refit) and that variant goes into the model directory.
    :param data_fingerprint: the data's fingerprint, recorded in the model card and the leaderboard.
    """

    train_uri: str = from_preprocess("split_uris", "train", default="")
    validation_uri: str = from_preprocess("split_uris", "validation", default="")
    feature_columns: list[str] = from_preprocess("feature_columns", default_factory=list)
    label_column: str = from_preprocess("label_column", default="")  # required: "" only keeps the field order valid
    classes: list[Any] | None = from_preprocess("classes", optional=True)
    preprocessor_uri: str | None = from_preprocess("preprocessor_uri")
    preprocessor_variants: dict[str, str] | None = from_preprocess("preprocessor_variants", optional=True)
    data_fingerprint: str = from_preprocess("fingerprint", default="")

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        for name in ("train_uri", "validation_uri"):
            require_non_empty(owner, name, getattr(self, name))
        _require_label_column(owner, self.label_column)
        if not isinstance(self.feature_columns, list) or not self.feature_columns or any(
            not isinstance(column, str) or not column for column in self.feature_columns
        ):
            raise SpecError(f"{owner}.feature_columns must be a non-empty list of column names, "
                            f"got {self.feature_columns!r}")
        if self.label_column in self.feature_columns:
            raise SpecError(f"{owner}.label_column {self.label_column!r} is also listed in feature_columns")
        if self.preprocessor_uri is not None:
            require_non_empty(owner, "preprocessor_uri", self.preprocessor_uri)
        require_variants(owner, self.preprocessor_variants)
        require_classes(owner, self.classes)
        if not isinstance(self.data_fingerprint, str):
            raise SpecError(f"{owner}.data_fingerprint must be a string, got {self.data_fingerprint!r}")

    @property
    def task(self) -> str:
        return task_of(self.classes)


DATA_LOADING = ("auto", "ray_data", "direct")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_SPREAD")


@dataclasses.dataclass
class TrainSpec(PreprocessedData):
    """Spec of the ``train`` stage: fit one model family on Ray Train and write a model directory.

    The data fields (splits, columns, classes, preprocessor, fingerprint) are :class:`PreprocessedData`'s.

    :param test_uri: the held-out test split (the model card's test metrics).
    :param config: ``family`` (``lightning``, ``xgboost``, ``extra_trees``, ``random_forest`` or
        ``linear``) and hyperparameters, or an ensemble's (family ``ensemble``, its ``members``); a
        RayTune best config can be passed as is. Missing hyperparameters take the family's defaults.
    :param compute: the GPU probe's compute spec (``ComputeSpec`` as a dict); default: one CPU worker.
    :param accelerator: ``auto``: GPU or CPU from the probe's answer and the size of the work
        (:func:`airflow_ray_ml_stages.device.choose_device`); ``gpu``: the GPU whenever the probe
        found one; ``cpu``: never the GPU.
    :param num_workers: Ray Train workers; 0 runs Train's local mode (the loop runs in the job's
        own process: no actor start-up, but no worker to restart from a checkpoint either). None
        sizes from the data: below ``scale_out_min_rows`` training rows local mode (on GPU, the
        job's process holds the GPU); from there the compute spec's ``num_workers``, except that a
        plan of one worker trains in the job's process while the splits fit in ``direct_max_bytes``.
    :param scale_out_min_rows: training rows from which the stage uses the compute spec's workers.
    :param direct_max_bytes: the largest in-memory size of the three splits (rows x columns x 8
        bytes) that a one-worker plan trains in the job's process rather than on one Ray
        Train worker fed by Ray Data, which on one node only adds their start-up.
    :param gpu_placement_timeout_s: how long to wait for the GPU workers' placement before
        training on CPU instead.
    :param resource_wait_s: how long Ray Train workers may wait for their CPUs before the stage
        fails naming what holds them (Serve applications, other jobs); on an autoscaling cluster,
        allow for a new node's start-up.
    :param max_failures: worker failures Ray Train recovers from (from the last checkpoint).
    :param checkpoint_every: checkpoint (and report) every N epochs (lightning) or rounds (xgboost);
        0: every epoch, or every tenth of the rounds. A forest keeps no checkpoint.
    :param data_loading: ``ray_data`` (the splits as Ray Datasets, sharded by Ray Train),
        ``direct`` (each worker reads the Parquet files with pyarrow: no Ray Data start-up), or
        ``auto``: ``ray_data`` for Ray Train workers from ``scale_out_min_rows`` training rows,
        ``direct`` otherwise.
    :param seed: the random seed; the same seed gives the same metrics on CPU.
    :param placement_strategy: how Ray places the workers: ``PACK`` (fewest nodes, the default),
        ``SPREAD`` or ``STRICT_SPREAD`` (one worker per node), as in Ray Train's ``ScalingConfig``.
    :param model_subdir: the model directory's name under ``artifact_dir``.
    """

    stage: ClassVar[str] = "train"
    test_uri: str = from_preprocess("split_uris", "test", default="")
    config: dict[str, Any] = dataclasses.field(default_factory=lambda: {"family": "lightning"})
    compute: dict[str, Any] = dataclasses.field(default_factory=default_compute)
    accelerator: str = "auto"
    num_workers: int | None = None
    scale_out_min_rows: int = 200_000
    direct_max_bytes: int = DIRECT_MAX_BYTES
    gpu_placement_timeout_s: float = 60.0
    resource_wait_s: float = 120.0
    max_failures: int = 2
    checkpoint_every: int = 0
    data_loading: str = "auto"
    seed: int = 42
    placement_strategy: str = "PACK"
    model_subdir: str = "model"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("test_uri", "model_subdir"):
            require_non_empty("TrainSpec", name, getattr(self, name))
        resolve_train_config(self.config)
        if self.scaler is not None and self.preprocessor_uri is None:
            raise SpecError(
                f"TrainSpec.config asks for scaler {self.scaler!r} but no preprocessor_uri says how the splits "
                "were scaled; pass the preprocess manifest's preprocessor_uri (and preprocessor_variants)"
            )
        ComputeSpec.from_dict(self.compute)
        require_choice("TrainSpec", "accelerator", self.accelerator, ACCELERATOR_CHOICES)
        if self.num_workers is not None:
            require_int_range("TrainSpec", "num_workers", self.num_workers, 0)
        require_int_range("TrainSpec", "scale_out_min_rows", self.scale_out_min_rows, 1)
        require_int_range("TrainSpec", "direct_max_bytes", self.direct_max_bytes, 0)
        require_int_range("TrainSpec", "max_failures", self.max_failures, -1)
        require_int_range("TrainSpec", "checkpoint_every", self.checkpoint_every, 0)
        require_int_range("TrainSpec", "seed", self.seed, 0)
        require_choice("TrainSpec", "data_loading", self.data_loading, DATA_LOADING)
        require_choice("TrainSpec", "placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES)
        require_positive("TrainSpec", "gpu_placement_timeout_s", self.gpu_placement_timeout_s, or_zero=True,
                         unit="seconds")
        require_positive("TrainSpec", "resource_wait_s", self.resource_wait_s, unit="seconds")

    @property
    def family(self) -> str:
        return self.config.get("family", "lightning")

    @property
    def scaler(self) -> str | None:
        """The scaler the config asks for (RayTune's best config names one), or None: as written."""
        return self.config.get("scaler")

    def resolved_config(self) -> dict[str, Any]:
        return resolve_train_config(self.config)


@dataclasses.dataclass
class TrainResult(JsonDataclass):
    """What the ``train`` stage returns (flattened into its manifest and the XCom).

    :param model_dir: URI of the model directory (model card, checkpoint, preprocessor).
    :param family: ``lightning``, ``xgboost``, ``extra_trees``, ``random_forest``, ``linear`` or ``ensemble``.
    :param metrics: ``{"validation": {...}, "test": {...}}``, the task's metrics: rmse, mae,
        acc_0_5, acc_1_0 (regression) or log_loss, accuracy, macro_f1 (classification).
    :param baseline: the test metrics of a model that ignores the features (see ``ModelCard.baseline``).
    :param config: the hyperparameters actually used (defaults filled in).
    :param model_version: a short unique id of this model.
    :param compute_used: workers, CPUs, GPUs and device actually used, and any GPU fallback.
    :param training: epochs or rounds run, restarts and the checkpoint resumed from, timings.
    """

    model_dir: str
    family: str
    metrics: dict[str, dict[str, float]]
    baseline: dict[str, float]
    config: dict[str, Any]
    model_version: str
    compute_used: dict[str, Any]
    training: dict[str, Any]
    data_fingerprint: str = ""
    task: str = "regression"
    classes: list[Any] | None = None


SCORE_MISSING_VALUES = ("model", "impute", "drop", "fail")
SCORE_UNSEEN_CATEGORIES = ("missing", "fail")


@dataclasses.dataclass
class ScoreSpec(StageSpec):
    """Spec of the ``score`` stage: batch predictions for a file of new rows with a trained model.

    :param input_uri: a CSV (comma or the UCI semicolon layout) or Parquet file, or a directory of
        them; local path, ``s3://`` or ``gs://``.
    :param model_dir: the model directory the ``train`` stage wrote (what the deploy task served).
    :param output_uri: where the predictions go; None: next to the input, as
        ``<input name>.predictions-<model version>`` (``-2``, ``-3``... when that exists).
    :param prediction_column: the added column; None: ``predicted_<label column>``.
    :param batch_size: rows per batch handed to the model.
    :param concurrency: scoring actors (each loads the model once) of the ``ray_data`` engine.
    :param cpus_per_actor: CPUs each scoring actor reserves (fractional leaves Ray Data headroom).
    :param engine: ``direct`` (the job's driver loads the model once and scores each file in
        batches, with pyarrow), ``ray_data`` (a pool of ``concurrency`` actors across the cluster)
        or ``auto``: direct when the input is at most ``direct_max_bytes``, Ray Data otherwise.
        The output does not depend on it.
    :param direct_max_bytes: input size up to which ``auto`` scores in the driver without Ray Data's start-up.
    :param missing_values: what a row with a missing value (empty, ``NA``, null, NaN or infinite) gets:
        ``impute`` (as the model was trained: the training split's median or most frequent value;
        only for a model trained with ``nan_policy='impute'``), ``drop`` (left out of the output,
        counted in ``rows_dropped``), ``fail``, or ``model``: ``impute`` where the model imputes, else ``drop``.
    :param unseen_categories: what a value of a categorical column that the model was not trained on
        gets: ``missing`` (scored as a missing value, as ``missing_values`` says; the drift report
        counts its share per column) or ``fail``.
    :param drift_watch: a column whose population stability index against the model's training
        data is at least this is worth watching (the drift report's ``watch``).
    :param drift_alert: a column whose population stability index is above this has drifted; a
        file with such a column gets the verdict ``drift``.
    :param drift_max_rows: the drift report counts at most this many of the input's rows (in file
        order), read once more in the job's driver; 0: no drift report.
    """

    stage: ClassVar[str] = "score"
    input_uri: str = ""
    model_dir: str = ""
    output_uri: str | None = None
    prediction_column: str | None = None
    batch_size: int = 4096
    concurrency: int = 1
    cpus_per_actor: float = 0.5
    engine: str = "auto"
    direct_max_bytes: int = DIRECT_MAX_BYTES
    missing_values: str = "model"
    unseen_categories: str = "missing"
    drift_watch: float = 0.1
    drift_alert: float = 0.25
    drift_max_rows: int = 1_000_000

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice("ScoreSpec", "missing_values", self.missing_values, SCORE_MISSING_VALUES)
        require_choice("ScoreSpec", "unseen_categories", self.unseen_categories, SCORE_UNSEEN_CATEGORIES)
        require_positive("ScoreSpec", "drift_watch", self.drift_watch)
        require_positive("ScoreSpec", "drift_alert", self.drift_alert)
        if self.drift_alert < self.drift_watch:
            raise SpecError(f"ScoreSpec.drift_alert ({self.drift_alert!r}) must be at least drift_watch "
                            f"({self.drift_watch!r}): PSI from watch to alert is worth watching, above alert is drift")
        require_int_range("ScoreSpec", "drift_max_rows", self.drift_max_rows, 0)
        require_non_empty("ScoreSpec", "input_uri", self.input_uri)
        require_non_empty("ScoreSpec", "model_dir", self.model_dir)
        if self.output_uri is not None:
            require_non_empty("ScoreSpec", "output_uri", self.output_uri)
        if self.prediction_column is not None:
            require_non_empty("ScoreSpec", "prediction_column", self.prediction_column)
        require_int_range("ScoreSpec", "batch_size", self.batch_size, 1)
        require_int_range("ScoreSpec", "concurrency", self.concurrency, 1)
        require_positive("ScoreSpec", "cpus_per_actor", self.cpus_per_actor)
        require_choice("ScoreSpec", "engine", self.engine, ENGINES)
        require_int_range("ScoreSpec", "direct_max_bytes", self.direct_max_bytes, 0)


@dataclasses.dataclass
class ScoreResult(JsonDataclass):
    """What the ``score`` stage wrote: the predictions' location, row count and a summary of them
    (``predictions``: mean, min and max for regression; the count of each class for classification),
    which engine scored it (``engine``, ``engine_reason``), what missing values got
    (``missing_values``: ``impute``, ``drop`` or ``fail``; ``rows_dropped``: rows left out for them),
    and the drift report (``drift``: the verdict, the drifted columns, each column's PSI, ``report_uri``;
    empty where ``drift_max_rows`` is 0)."""

    output_uri: str
    output_format: str
    rows: int
    prediction_column: str
    model_dir: str
    model_version: str
    input_uri: str
    predictions: dict[str, float]
    engine: str
    engine_reason: str
    missing_values: str = "fail"
    rows_dropped: int = 0
    drift: dict[str, Any] = dataclasses.field(default_factory=dict)


SEARCHERS = ("adaptive", "random", "optuna")
TUNE_SCHEDULERS = ("asha", "none")
TUNE_METRICS = {f"val_{name}": mode for metrics in TASK_METRICS.values() for name, mode in metrics.items()}
"""The metrics a search can optimise (on the validation split) and their direction; each task takes its own."""


@dataclasses.dataclass
class TuneSpec(PreprocessedData):
    """Spec of the ``tune`` stage: search model family x scaler x hyperparameters with Ray Tune.

    The data fields (splits, columns, classes, preprocessor, fingerprint) are :class:`PreprocessedData`'s.
    The test split is not an input: it is never used for choosing.

    :param search_space: see :mod:`airflow_ray_ml_stages.search_space`; None: ``DEFAULT_SEARCH_SPACE``.
    :param metric: the validation metric to optimise, one of the task's: ``val_rmse``, ``val_mae``,
        ``val_acc_0_5``, ``val_acc_1_0`` (regression), ``val_log_loss``, ``val_accuracy``,
        ``val_macro_f1`` (classification); its direction follows. None: ``val_rmse`` for regression,
        ``val_log_loss`` for classification.
    :param searcher: ``adaptive`` (random hyperparameters, each trial's family drawn by the families'
        results so far: :mod:`airflow_ray_ml_stages.family_search`; a space with grid domains is
        searched as ``random`` searches it), ``random`` (Ray Tune's random/grid search) or
        ``optuna`` (Optuna's TPE).
    :param start_configs: configs the adaptive and random searches run first, before they sample
        (Ray Tune's ``points_to_evaluate``; they count toward ``num_samples``): each a train config of
        a family the space picks, with ``scaler`` (default: the space's first) and any hyperparameters
        (those it does not name are sampled). None: ``DEFAULT_START_CONFIGS`` of the space's families
        (XGBoost, ExtraTrees, the random forest and the linear model with their defaults), none for a
        space with grid domains; ``[]``: none. With ``searcher`` ``optuna`` it must be None or ``[]``.
    :param scheduler: ``asha`` (early stopping of poor trials) or ``none`` (every trial runs to its end).
    :param num_samples: trials to run (times the grid's size, where the space has grid domains).
    :param max_concurrent_trials: trials at once; None: as many as the CPUs free when the search
        starts hold, less Ray Data's headroom (see ``cpus_per_trial``).
    :param cpus_per_trial: CPUs each trial reserves; None: sized to the model and the cluster: one
        thread per million training cells (rows x features, up to the compute spec's
        ``cpus_per_worker``) while the free CPUs hold two such trials beside Ray Data's headroom,
        else two trials share the free CPUs in fractions.
    :param compute: the GPU probe's compute spec; a GPU spec gives each trial ``gpus_per_worker``.
    :param accelerator: ``auto``: GPU or CPU from the probe's answer and the size of the work
        (:func:`airflow_ray_ml_stages.device.choose_device`); ``gpu``: the GPU whenever the probe
        found one; ``cpu``: never the GPU.
    :param time_budget_s: stop starting and running trials after this long; None: no limit.
    :param reports_per_trial: how many times a trial reports over its full budget (epochs or
        rounds); ASHA's rungs count these reports, so both families are cut at the same share. A
        forest reports once, at its end: ASHA never stops one (it trains in seconds).
    :param asha_grace_period: reports a trial always gets before ASHA may stop it.
    :param asha_reduction_factor: ASHA keeps the best 1/N at each rung.
    :param seed: seeds the searcher and every trial's training (the train stage's default, 42, so
        RayTrain given the best config trains the same model).
    :param reuse_actors: run the next trial in a finished (or stopped) trial's actor (Ray Tune's
        ``reuse_actors``) instead of starting a new one, which saves the actor's start-up and its
        torch/xgboost imports per trial; each trial still trains in a trial actor, seeded afresh.
        False: a new actor per trial.
    :param resource_wait_s: how long the search waits for its first trial to start before it
        fails naming what holds the cluster's resources (Serve applications, other jobs); on an
        autoscaling cluster, allow for a new node's start-up.
    :param ensemble_size: rounds of greedy ensemble selection (Caruana et al. 2004) over the
        completed trials' validation predictions; where the weighted average of the trials it picks
        beats the best trial on ``metric``, that ensemble is the best config (family ``ensemble``,
        its members' trained models kept as they are). 0: the best trial alone.
    :param cv_folds: where one validation split is too small to rank trials by (fewer than 300 rows,
        or fewer than 100 rows of a class: :func:`airflow_ray_ml_stages.folds.cross_validation_reason`),
        each trial is trained and scored ``cv_folds`` times over the training and validation rows
        together, each time validated on the fold it left out (stratified by class): trials are
        ranked, and the ensemble is selected, by their out-of-fold predictions on all those rows, and
        a trial's model is the average of its fold models (bagging). 0: every trial trains on the
        training split and is scored on the validation split.
    :param cv_max_rows: the most training and validation rows together that are cross-validated: above
        it a trial trained ``cv_folds`` times would cost too much, and one validation split is used.
    """

    stage: ClassVar[str] = "tune"
    search_space: dict[str, Any] | None = None
    metric: str | None = None
    searcher: str = "adaptive"
    start_configs: list[dict[str, Any]] | None = None
    scheduler: str = "asha"
    num_samples: int = 16
    max_concurrent_trials: int | None = None
    cpus_per_trial: float | None = None
    compute: dict[str, Any] = dataclasses.field(default_factory=default_compute)
    accelerator: str = "auto"
    time_budget_s: float | None = None
    reports_per_trial: int = 10
    asha_grace_period: int = 2
    asha_reduction_factor: int = 3
    seed: int = 42
    reuse_actors: bool = True
    resource_wait_s: float = 120.0
    ensemble_size: int = 25
    cv_folds: int = 5
    cv_max_rows: int = 20000

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = "TuneSpec"
        require_int_range(owner, "ensemble_size", self.ensemble_size, 0)
        require_int_range(owner, "cv_max_rows", self.cv_max_rows, 0)
        require_int_range(owner, "cv_folds", self.cv_folds, 0)
        if self.cv_folds == 1:
            raise SpecError(f"{owner}.cv_folds must be 0 (no cross-validation) or at least 2, got 1")
        if not isinstance(self.reuse_actors, bool):
            raise SpecError(f"{owner}.reuse_actors must be true or false, got {self.reuse_actors!r}")
        if self.metric is None:
            self.metric = f"val_{DEFAULT_METRIC[self.task]}"
        require_choice(owner, "metric", self.metric, tuple(f"val_{name}" for name in TASK_METRICS[self.task]))
        require_choice(owner, "searcher", self.searcher, SEARCHERS)
        require_choice(owner, "scheduler", self.scheduler, TUNE_SCHEDULERS)
        require_int_range(owner, "num_samples", self.num_samples, 1)
        if self.max_concurrent_trials is not None:
            require_int_range(owner, "max_concurrent_trials", self.max_concurrent_trials, 1)
        require_positive(owner, "cpus_per_trial", self.cpus_per_trial, or_none=True)
        ComputeSpec.from_dict(self.compute)
        require_choice(owner, "accelerator", self.accelerator, ACCELERATOR_CHOICES)
        require_positive(owner, "time_budget_s", self.time_budget_s, or_none=True, unit="seconds")
        require_positive(owner, "resource_wait_s", self.resource_wait_s, unit="seconds")
        require_int_range(owner, "reports_per_trial", self.reports_per_trial, 1)
        require_int_range(owner, "asha_grace_period", self.asha_grace_period, 1)
        require_int_range(owner, "asha_reduction_factor", self.asha_reduction_factor, 2)
        require_int_range(owner, "seed", self.seed, 0)
        space = self.space()
        if self.searcher == "optuna" and space.has_grid:
            raise SpecError(f"{owner}: searcher 'optuna' cannot search grid domains; use choice, or searcher 'random'")
        if self.start_configs is not None and not isinstance(self.start_configs, list):
            raise SpecError(f"{owner}.start_configs must be a list of train configs, [] or null, got "
                            f"{self.start_configs!r}")
        if self.searcher == "optuna" and self.start_configs:
            raise SpecError(f"{owner}.start_configs are run by searchers 'adaptive' and 'random'; Optuna's TPE starts "
                            "from samples of its own: give searcher 'adaptive', or start_configs [] or null")
        self.start_points()
        asked = [scaler for scaler in space.scalers if scaler is not None]
        if asked and self.preprocessor_uri is None:
            raise SpecError(
                f"{owner}.search_space asks for scaler(s) {asked} but no preprocessor_uri says how the splits "
                "were scaled; pass the preprocess manifest's preprocessor_uri and preprocessor_variants"
            )

    @property
    def mode(self) -> str:
        return TUNE_METRICS[self.metric]

    def space(self):
        from airflow_ray_ml_stages.search_space import DEFAULT_SEARCH_SPACE, SearchSpace

        return SearchSpace(DEFAULT_SEARCH_SPACE if self.search_space is None else self.search_space)

    def start_points(self) -> list[dict[str, Any]]:
        """The start configs as points of the space (Ray Tune's ``points_to_evaluate``), at most ``num_samples``."""
        from airflow_ray_ml_stages.search_space import DEFAULT_START_CONFIGS

        space = self.space()
        if self.searcher == "optuna":
            return []
        if self.start_configs is None:
            configs = [] if space.has_grid else [c for c in DEFAULT_START_CONFIGS if c["family"] in space.families]
        else:
            configs = self.start_configs
        points = [space.start_point(config, f"TuneSpec.start_configs[{index}]") for index, config in enumerate(configs)]
        return points[: self.num_samples]


@dataclasses.dataclass
class TuneResult(JsonDataclass):
    """What the ``tune`` stage returns (its manifest and the XCom).

    :param best_config: ``family``, ``scaler`` and the family's hyperparameters of the best
        completed trial, or (family ``ensemble``) the ensemble's ``members`` where it beats every
        trial, or the best trial's fold models where the trials were cross-validated (``cv_folds``):
        pass it as is to RayTrainOperator's ``config``.
    :param best_trial_id: that trial's id (the leaderboard's rank 1); ``ensemble`` for an ensemble.
    :param metric: the validation metric optimised; ``mode`` its direction.
    :param best_metric: the best trial's value of ``metric`` (its final model, on validation).
    :param best_metrics: all validation metrics of the best trial.
    :param best_checkpoint_uri: the best trial's (or the ensemble's) model directory (loadable with ``load_model``).
    :param leaderboard_json_uri: every trial, best first (see the README for the row format).
    :param leaderboard_csv_uri: the same rows, flattened.
    :param plot_uri: PNG: the metric of every trial over time, with the best-so-far line.
    :param trials: counts: ``total``, ``completed``, ``failed``, ``early_stopped``.
    :param searcher: ``adaptive``, ``random`` or ``optuna``; ``scheduler``: ``asha`` or ``none``.
    :param time_s: the search's wall time.
    :param resources_per_trial: what each trial reserved (``cpu``, ``gpu``) and the ``threads`` it trained with.
    :param trial_sizing: why the trials were sized so, and how many were let run at once.
    :param most_trials_at_once: the largest number of trials that ran at the same time.
    """

    best_config: dict[str, Any]
    best_trial_id: str
    metric: str
    mode: str
    best_metric: float
    best_metrics: dict[str, float]
    best_checkpoint_uri: str | None
    leaderboard_json_uri: str
    leaderboard_csv_uri: str
    plot_uri: str
    trials: dict[str, int]
    searcher: str
    scheduler: str
    time_s: float
    search_space: dict[str, Any] = dataclasses.field(default_factory=dict)
    resources_per_trial: dict[str, float] = dataclasses.field(default_factory=dict)
    data_fingerprint: str = ""
    trial_sizing: str = ""
    most_trials_at_once: int = 0
