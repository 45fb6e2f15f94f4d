"""Stage ``train``: fit a Lightning MLP or an XGBoost booster on Ray Train and write a model directory.

Run as ``python -m rayml.train --spec '<json>'`` (a Ray job). The stage

1. sizes the run: Train's local mode on CPU (one GPU worker on GPU) below ``scale_out_min_rows``
   training rows (Ray Train's fixed start-up cost dominates at wine scale), the compute spec's
   workers above it; a local-mode run on CPU reading the splits directly runs the same loop in
   the job's process without Ray Train at all (no ``ray.init``, no ``ray.train`` import);
2. on a GPU compute spec, first checks that the workers' GPU placement can be had within
   ``gpu_placement_timeout_s``, and trains on CPU (saying so in the log and the manifest) if not;
3. trains with ``TorchTrainer`` + ``ray.train.lightning`` or ``XGBoostTrainer`` (V2 API), reading
   the splits as Ray Datasets, checkpointing into the run's artifact directory under a run name
   derived from it, with ``FailureConfig`` so a killed worker resumes from the last checkpoint;
4. has rank 0 evaluate the trained model in the worker and write the weights (tensors-only
   ``model.pt`` or XGBoost's ``model.ubj``) and its validation/test predictions;
5. computes the metrics, a mean-predictor baseline, and writes the model card.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import numpy as np

from rayml import artifacts
from rayml.constants import JOB_ENV_VARS
from rayml.errors import DataSourceError, SpecError
from rayml.metrics import regression_metrics
from rayml.models import MODEL_CARD, PREPROCESSOR, TORCH_CONFIG, TORCH_WEIGHTS, XGBOOST_MODEL
from rayml.preprocessor import Preprocessor, feature_affine
from rayml.specs import ComputeSpec, TrainResult, TrainSpec
from rayml.stage import main_of, run_stage

log = logging.getLogger("rayml.train")

EVALUATION_DIR = "evaluation"
WORKERS_DIR = "workers"
TRAIN_RUNS_DIR = "train_runs"
SPLITS = ("train", "validation", "test")


# -- data ------------------------------------------------------------------------------------


class ParquetSplit:
    """A split written as one Parquet file or a directory of them, read with ``pyarrow.parquet`` alone.

    (``pyarrow.dataset`` would do, but importing it imports pandas too: ~0.5 s of a wine-scale run.)
    Files are read in sorted path order, so a split reads the same way every time.
    """

    def __init__(self, uri: str, columns: list[str]) -> None:
        from pyarrow import fs as pafs

        self.uri = uri
        self.filesystem, path = artifacts.resolve(uri)
        try:
            info = self.filesystem.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"{path} does not exist")
            if info.type == pafs.FileType.Directory:
                found = self.filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
                self.files = sorted(entry.path for entry in found if entry.type == pafs.FileType.File
                                    and not os.path.basename(entry.path).startswith((".", "_")))
            else:
                self.files = [path]
            if not self.files:
                raise FileNotFoundError(f"{path} holds no Parquet file")
            names = self._file(self.files[0]).schema_arrow.names
        except (FileNotFoundError, OSError) as err:
            raise DataSourceError(f"cannot read the Parquet split {uri!r}: {err}") from err
        missing = sorted(set(columns) - set(names))
        if missing:
            raise DataSourceError(
                f"split {uri!r} lacks column(s) {missing}; it has {names}. "
                "Pass feature_columns/label_column that match the preprocessed data"
            )

    @property
    def num_rows(self) -> int:
        """Rows in every file, from the Parquet footers."""
        return sum(self._file(path).metadata.num_rows for path in self.files)

    def _file(self, path: str):
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.filesystem.open_input_file(path))

    def to_table(self, columns: list[str]):
        import pyarrow as pa

        return pa.concat_tables([self._file(path).read(columns=columns) for path in self.files])


def _parquet_dataset(uri: str, columns: list[str]) -> ParquetSplit:
    return ParquetSplit(uri, columns)


def _label_stats(uri: str, label: str, columns: list[str]) -> tuple[int, float]:
    """Rows and label mean of a split, read with pyarrow alone (cheap: one column)."""
    table = _parquet_dataset(uri, columns).to_table(columns=[label])
    if table.num_rows == 0:
        raise DataSourceError(f"split {uri!r} has no rows")
    return table.num_rows, float(np.mean(table.column(label).to_numpy(zero_copy_only=False)))


def shard_arrays(shard, features: list[str], label: str) -> tuple[np.ndarray, np.ndarray]:
    """Read a Ray Data shard (or dataset) once into float32 feature and label arrays."""
    xs, ys = [], []
    for batch in shard.iter_batches(batch_size=65536, batch_format="numpy"):
        xs.append(np.column_stack([np.asarray(batch[column], dtype=np.float32) for column in features]))
        ys.append(np.asarray(batch[label], dtype=np.float32))
    if not xs:
        return np.zeros((0, len(features)), np.float32), np.zeros(0, np.float32)
    return np.concatenate(xs), np.concatenate(ys)


def split_arrays(cfg: dict[str, Any], split: str, rank: int = 0, world_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A split as arrays: from the Ray Dataset shard, or read directly (small data) and sliced by rank.

    With ``cfg["feature_affine"]`` (``[multiply, add]`` per feature, see
    :func:`rayml.preprocessor.feature_affine`) the features are mapped to another scaler's scaling.
    """
    features, label = cfg["feature_columns"], cfg["label_column"]
    if cfg["data_loading"] == "ray_data":
        import ray.data
        import ray.train

        ray.data.DataContext.get_current().enable_progress_bars = False
        x, y = shard_arrays(ray.train.get_dataset_shard(split), features, label)
        return _map_features(cfg, x), y
    table = _parquet_dataset(cfg["uris"][split], [*features, label]).to_table(columns=[*features, label])
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in features])
    y = table.column(label).to_numpy(zero_copy_only=False).astype(np.float32)
    x = _map_features(cfg, x)
    if split == "train" and world_size > 1:
        return x[rank::world_size], y[rank::world_size]
    return x, y


def _map_features(cfg: dict[str, Any], x: np.ndarray) -> np.ndarray:
    affine = cfg.get("feature_affine")
    if not affine:
        return x
    multiply, add = (np.asarray(part, dtype=np.float64) for part in affine)
    return (x.astype(np.float64) * multiply + add).astype(np.float32)


def tune_report(step: dict[str, Any], labels: np.ndarray, predictions: np.ndarray) -> None:
    """Report a trial's validation metrics now (``val_rmse``, ``val_mae``, ``val_acc_*``) to Ray Tune."""
    from ray import tune

    metrics = {f"val_{name}": value for name, value in regression_metrics(labels, predictions).items()}
    # Tune's own "timestamp" has whole seconds: too coarse to plot short trials over time.
    tune.report({**metrics, **step, "reported_at": time.time()})


def _write_final(cfg: dict[str, Any], final: dict[str, Any]) -> None:
    artifacts.write_json_atomic(artifacts.join(cfg["artifact_dir"], EVALUATION_DIR, "final.json"), final)


# -- helpers shared by the two training loops (they run in Ray Train workers) ----------------


def _announce_worker(cfg: dict[str, Any], rank: int) -> None:
    """Record this worker process (pid, rank, node, start time): operators and tests find workers here."""
    ray = sys.modules.get("ray")  # never imported just for this: the in-process runner runs without Ray
    node_id = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    record = {"pid": os.getpid(), "rank": rank, "host": platform.node(), "node_id": node_id, "started": time.time()}
    uri = artifacts.join(cfg["artifact_dir"], WORKERS_DIR, f"rank{rank}-pid{os.getpid()}.json")
    artifacts.write_json_atomic(uri, record)


def _write_evaluation(cfg: dict[str, Any], split: str, labels: np.ndarray, predictions: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, y_true=labels.astype(np.float64), y_pred=predictions.astype(np.float64))
    artifacts.write_bytes_atomic(artifacts.join(cfg["artifact_dir"], EVALUATION_DIR, f"{split}.npz"), buffer.getvalue())


def _checkpoint_every(cfg: dict[str, Any]) -> int:
    if cfg["checkpoint_every"]:
        return cfg["checkpoint_every"]
    if cfg["config"]["family"] == "xgboost":
        return max(1, cfg["config"]["num_boost_round"] // 10)
    return 1


# -- where a training loop runs -------------------------------------------------------------------


class InProcessTrainContext:
    """What the training loops ask of Ray Train, for a run in the job's own process without it.

    It behaves as Train's local mode does (rank 0 of 1, no checkpoint to resume from, a report
    keeps only the last metrics), without importing Ray Train or starting a Train run: at wine
    scale that start-up (importing ``ray.train``, 1.5-3.5 s, plus ``ray.init``) costs about as
    much as the training itself.
    """

    tune = False

    def __init__(self) -> None:
        self.last_metrics: dict[str, Any] | None = None
        self.reports = 0

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation", "test")

    def get_world_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_checkpoint(self):
        return None

    def report(self, metrics: dict[str, Any], checkpoint_directory: str | None = None) -> None:
        self.last_metrics, self.reports = dict(metrics), self.reports + 1


class RayTrainContext:
    """A training loop's view of a Ray Train worker: rank, world size, checkpoints and reports."""

    tune = False

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation", "test")

    def __init__(self) -> None:
        import ray.train

        self._train = ray.train
        self._context = ray.train.get_context()

    def get_world_rank(self) -> int:
        return self._context.get_world_rank()

    def get_world_size(self) -> int:
        return self._context.get_world_size()

    def get_checkpoint(self):
        return self._train.get_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_directory: str | None = None) -> None:
        from ray.train import Checkpoint

        checkpoint = Checkpoint.from_directory(checkpoint_directory) if checkpoint_directory else None
        self._train.report(metrics, checkpoint=checkpoint)


class TuneTrialContext(InProcessTrainContext):
    """A training loop inside a Ray Tune trial (``cfg["session"] == "tune"``): rank 0 of 1, always a
    fresh start (a failed trial is recorded, not retried), reports go to Ray Tune, and the test
    split is never looked at: choosing must not see it."""

    tune = True

    def evaluation_splits(self) -> tuple[str, ...]:
        return ("validation",)


def _loop_context(cfg: dict[str, Any], context: Any):
    """The context a training loop was given, else the one its place implies (Tune trial or Train worker)."""
    if context is not None:
        return context
    return TuneTrialContext() if cfg.get("session") == "tune" else RayTrainContext()


# -- Lightning ---------------------------------------------------------------------------------


def lightning_train_loop(cfg: dict[str, Any], context: Any = None) -> None:
    """Lightning MLP with early stopping and checkpoints.

    Runs in Ray Train workers (``TorchTrainer`` with ``RayDDPStrategy``; ``context`` None) or, for a
    small CPU run, in the job's own process with an :class:`InProcessTrainContext`.
    """
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import EarlyStopping
    from torch.utils.data import DataLoader, TensorDataset

    from rayml.models.mlp import lightning_module, model_config

    context = _loop_context(cfg, context)
    in_ray_train = isinstance(context, RayTrainContext)
    rank, world_size = context.get_world_rank(), context.get_world_size()
    _announce_worker(cfg, rank)
    config, features, label, seed = cfg["config"], cfg["feature_columns"], cfg["label_column"], cfg["seed"]
    pl.seed_everything(seed, workers=True, verbose=False)
    torch.set_num_threads(cfg["threads"])

    train_x, train_y = split_arrays(cfg, "train", rank, world_size)
    val_x, val_y = split_arrays(cfg, "validation")
    train_loader = DataLoader(
        TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y)),
        batch_size=config["batch_size"], shuffle=True, generator=torch.Generator().manual_seed(seed + rank),
    )
    val_loader = DataLoader(TensorDataset(torch.from_numpy(val_x), torch.from_numpy(val_y)), batch_size=4096)
    module = lightning_module(config, len(features), cfg["label_mean"])

    every = _checkpoint_every(cfg)
    callbacks = []
    if in_ray_train:
        from ray.train.lightning import RayTrainReportCallback

        class ReportEveryCallback(RayTrainReportCallback):
            """RayTrainReportCallback, every ``every`` epochs: each report costs a controller round trip."""

            def on_train_epoch_end(self, trainer, pl_module):
                if (trainer.current_epoch + 1) % every == 0:
                    super().on_train_epoch_end(trainer, pl_module)

        callbacks.append(ReportEveryCallback())

    class TuneReportEveryCallback(pl.Callback):
        """In a Tune trial: the validation metrics every ``every`` epochs (ASHA decides on these)."""

        def on_train_epoch_end(self, trainer, pl_module):
            if (trainer.current_epoch + 1) % every:
                return
            was_training = pl_module.training
            pl_module.eval()
            with torch.inference_mode():
                predicted = pl_module.model(torch.from_numpy(val_x).to(pl_module.device)).cpu().numpy()
            pl_module.train(was_training)
            tune_report({"epoch": trainer.current_epoch + 1}, val_y, predicted)

    if context.tune:
        callbacks.append(TuneReportEveryCallback())
    if config["patience"]:
        callbacks.append(EarlyStopping(monitor="val_loss", patience=config["patience"], mode="min"))
    local_mode = cfg["local_mode"]
    if not local_mode:
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        accelerator="gpu" if cfg["use_gpu"] else "cpu",
        devices="auto" if not local_mode else 1,
        strategy="auto" if local_mode else RayDDPStrategy(),
        plugins=None if local_mode else [RayLightningEnvironment()],
        callbacks=callbacks,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if not local_mode:
        trainer = prepare_trainer(trainer)

    resumed_from_epoch = None
    checkpoint = context.get_checkpoint()
    if checkpoint:
        from ray.train.lightning import RayTrainReportCallback

        with checkpoint.as_directory() as directory:
            path = os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME)
            resumed_from_epoch = int(torch.load(path, map_location="cpu", weights_only=True)["epoch"]) + 1
            print(f"rayml.train: worker rank {rank} (pid {os.getpid()}) resumes from the checkpoint "
                  f"after epoch {resumed_from_epoch}", flush=True)
            trainer.fit(module, train_loader, val_loader, ckpt_path=path, weights_only=True)
    else:
        trainer.fit(module, train_loader, val_loader)

    final = {"epochs_run": int(trainer.current_epoch), "resumed_from_epoch": resumed_from_epoch,
             "device": str(trainer.strategy.root_device),
             "best_val_loss": float(trainer.callback_metrics.get("val_loss", float("nan")))}
    if rank == 0:
        net = module.model.to("cpu").eval()
        evaluated = {"validation": (val_x, val_y)}
        if "test" in context.evaluation_splits():
            evaluated["test"] = split_arrays(cfg, "test")
        with torch.inference_mode():
            for split, (x, y) in evaluated.items():
                _write_evaluation(cfg, split, y, net(torch.from_numpy(x)).numpy())
        buffer = io.BytesIO()
        torch.save({name: tensor.detach().cpu().clone() for name, tensor in net.state_dict().items()}, buffer)
        artifacts.write_bytes_atomic(artifacts.join(cfg["model_dir"], TORCH_WEIGHTS), buffer.getvalue())
        artifacts.write_json_atomic(
            artifacts.join(cfg["model_dir"], TORCH_CONFIG),
            model_config(len(features), config["hidden_sizes"], config["dropout"], cfg["label_mean"]),
        )
        _write_final(cfg, final)


# -- XGBoost -----------------------------------------------------------------------------------


def xgboost_train_loop(cfg: dict[str, Any], context: Any = None) -> None:
    """XGBoost training loop, checkpoints every N rounds, resumable.

    Runs in Ray Train workers (V2 ``XGBoostTrainer``; ``context`` None), in a Ray Tune trial
    (``cfg["session"] == "tune"``) or, for a small CPU run, in the job's own process with an
    :class:`InProcessTrainContext`.
    """
    import xgboost

    context = _loop_context(cfg, context)
    rank, world_size = context.get_world_rank(), context.get_world_size()
    _announce_worker(cfg, rank)
    config, features, label = cfg["config"], cfg["feature_columns"], cfg["label_column"]

    train_x, train_y = split_arrays(cfg, "train", rank, world_size)
    val_x, val_y = split_arrays(cfg, "validation")
    dtrain = xgboost.DMatrix(train_x, label=train_y, feature_names=features)
    dvalidation = xgboost.DMatrix(val_x, label=val_y, feature_names=features)
    booster_keys = {"num_boost_round", "early_stopping_rounds", "family"}
    params = {
        "objective": "reg:squarederror", "eval_metric": "rmse", "tree_method": "hist",
        "seed": cfg["seed"], "nthread": cfg["threads"], "base_score": cfg["label_mean"],
        "device": "cuda" if cfg["use_gpu"] else "cpu",
        **{key: value for key, value in config.items() if key not in booster_keys},
    }
    every = _checkpoint_every(cfg)

    class ReportEveryCallback(xgboost.callback.TrainingCallback):
        """Report (with a checkpoint in XGBoost's own format) every ``every`` rounds, not each one."""

        def after_iteration(self, model, epoch, evals_log):
            rounds = model.num_boosted_rounds()
            if rounds % every == 0 and context.tune:
                tune_report({"round": rounds}, val_y, model.predict(dvalidation))
            elif rounds % every == 0:
                metrics = {"round": rounds, "validation_rmse": float(evals_log["validation"]["rmse"][-1])}
                with tempfile.TemporaryDirectory() as directory:
                    if rank == 0:
                        model.save_model(os.path.join(directory, XGBOOST_MODEL))
                    context.report(metrics, checkpoint_directory=directory if rank == 0 else None)
            return False

    start_booster, resumed_from_round = None, None
    checkpoint = context.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            start_booster = xgboost.Booster()
            start_booster.load_model(os.path.join(directory, XGBOOST_MODEL))
        resumed_from_round = start_booster.num_boosted_rounds()
        print(f"rayml.train: worker rank {rank} (pid {os.getpid()}) resumes from the checkpoint "
              f"after round {resumed_from_round}", flush=True)
    remaining = config["num_boost_round"] - (resumed_from_round or 0)
    booster = xgboost.train(
        params, dtrain, num_boost_round=max(0, remaining), evals=[(dvalidation, "validation")],
        early_stopping_rounds=config["early_stopping_rounds"] or None, xgb_model=start_booster,
        callbacks=[ReportEveryCallback()], verbose_eval=False,
    )
    rounds_run = booster.num_boosted_rounds()
    best = getattr(booster, "best_iteration", None)
    if config["early_stopping_rounds"] and best is not None and best + 1 < rounds_run:
        booster = booster[: best + 1]  # keep the best rounds, as early stopping intends
    final = {"rounds_run": rounds_run, "rounds_kept": booster.num_boosted_rounds(),
             "resumed_from_round": resumed_from_round, "device": params["device"]}
    # Every rank builds the evaluation DMatrix: with several workers, DMatrix construction is a
    # collective operation, and rank 0 alone would wait for the others.
    evaluated = {"validation": (val_x, val_y)}
    if "test" in context.evaluation_splits():
        evaluated["test"] = split_arrays(cfg, "test")
    predictions = {split: (y, booster.predict(xgboost.DMatrix(x, feature_names=features)))
                   for split, (x, y) in evaluated.items()}
    if rank == 0:
        for split, (y, predicted) in predictions.items():
            _write_evaluation(cfg, split, y, predicted)
        artifacts.write_bytes_atomic(artifacts.join(cfg["model_dir"], XGBOOST_MODEL), bytes(booster.save_raw("ubj")))
        _write_final(cfg, final)


# -- the driver (the Ray job's process) --------------------------------------------------------


def plan_workers(spec: TrainSpec, compute: ComputeSpec, train_rows: int, data_bytes: int) -> tuple[int, str]:
    """How many Ray Train workers to use (0: Train's local mode), and why (right-sizing).

    Below ``scale_out_min_rows`` the run is small enough that Ray Train's fixed start-up (a
    controller and worker actors that import torch/xgboost again) costs more than the training:
    CPU runs use local mode (the loop runs in the job's own process), GPU runs one worker (the
    job's process holds no GPU). From ``scale_out_min_rows`` the compute spec's workers are used,
    except a CPU plan of one worker: one Train worker fed by Ray Data does the job process's work
    plus both start-ups (measured on 454,790 training rows: XGBoost 21.5 s against 2.5 s in the
    job's process), so while the splits (``data_bytes`` in memory) fit ``direct_max_bytes`` it
    trains in the job's process too.
    """
    if spec.num_workers is not None:
        return spec.num_workers, f"num_workers={spec.num_workers} set in the spec"
    if train_rows < spec.scale_out_min_rows:
        workers = 1 if compute.use_gpu else 0
        where = "one GPU worker" if workers else "Train's local mode (in the job's process)"
        return workers, (f"{train_rows} training rows < scale_out_min_rows={spec.scale_out_min_rows}: {where}, "
                         "since Ray Train's fixed start-up cost dominates at this size")
    if not compute.use_gpu and compute.num_workers <= 1 and data_bytes <= spec.direct_max_bytes:
        return 0, (f"{train_rows} training rows >= scale_out_min_rows={spec.scale_out_min_rows}, but the compute "
                   f"spec plans one CPU worker and the splits ({data_bytes / 2**20:,.0f} MiB in memory) fit "
                   f"direct_max_bytes={spec.direct_max_bytes:,}: Train's local mode (in the job's process), since "
                   "one Ray Train worker would add only its and Ray Data's start-up")
    return compute.num_workers, (f"{train_rows} training rows >= scale_out_min_rows={spec.scale_out_min_rows}: "
                                 f"the compute spec's {compute.num_workers} worker(s)")


def gpu_placement_available(num_workers: int, cpus: float, gpus: float, timeout_s: float) -> bool:
    """Whether ``num_workers`` bundles of CPUs+GPUs can be placed within ``timeout_s``; releases them."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": cpus, "GPU": gpus}] * max(1, num_workers), strategy="PACK")
    try:
        return bool(group.wait(timeout_seconds=timeout_s))
    finally:
        remove_placement_group(group)


def scaler_plan(preprocessor_uri: str | None, variants: dict[str, str] | None, scaler: str | None,
                feature_columns: list[str]) -> tuple[list[list[float]] | None, str | None]:
    """How to give a model features scaled by ``scaler``: ``(feature_affine or None, preprocessor URI)``.

    The splits are written with ``preprocessor_uri``'s scaler. Asking for that one (or for none)
    changes nothing; asking for another maps the features with the preprocess manifest's variant
    of it (fitted on the same training statistics), and that variant is the model's preprocessor.
    """
    if scaler is None:
        return None, preprocessor_uri
    if preprocessor_uri is None:
        raise SpecError(f"scaler {scaler!r} asked for, but no preprocessor_uri says how the splits were scaled")
    written = Preprocessor.load(preprocessor_uri)
    if scaler == written.scaler:
        return None, preprocessor_uri
    uri = (variants or {}).get(scaler)
    if uri is None:
        raise SpecError(
            f"the config asks for scaler {scaler!r}, but the splits were written with {written.scaler!r} and the "
            f"preprocess manifest lists no {scaler!r} variant (preprocessor_variants: {sorted(variants or {})}); "
            f"rerun the preprocess stage (it writes every scaler's variant) or ask for scaler {written.scaler!r}"
        )
    multiply, add = feature_affine(written, Preprocessor.load(uri), list(feature_columns))
    return [multiply.tolist(), add.tolist()], uri


def _framework_versions(family: str) -> dict[str, str]:
    from importlib.metadata import version

    # The installed Ray's version without importing it (an in-process run never needs Ray).
    versions = {"python": platform.python_version(), "ray": version("ray"), "numpy": np.__version__}
    if family == "lightning":
        import pytorch_lightning
        import torch

        versions.update(torch=torch.__version__, pytorch_lightning=pytorch_lightning.__version__)
    else:
        import xgboost

        versions["xgboost"] = xgboost.__version__
    return versions


def run_name(artifact_dir: str) -> str:
    """The Ray Train run name: unique per Airflow task run (a retry of it resumes the same run)."""
    return "train-" + hashlib.sha1(artifact_dir.encode("utf-8")).hexdigest()[:16]


def _storage_path(artifact_dir: str) -> str:
    uri = artifacts.join(artifact_dir, TRAIN_RUNS_DIR)
    return uri if artifacts.is_remote(uri) else artifacts.resolve(uri)[1]


def _list_files(uri: str) -> list[str]:
    from pyarrow import fs as pafs

    filesystem, path = artifacts.resolve(uri)
    selector = pafs.FileSelector(path, allow_not_found=True)
    return [info.path for info in filesystem.get_file_info(selector) if info.type == pafs.FileType.File]


def _worker_record_uris(artifact_dir: str) -> list[str]:
    """URIs of the worker records (one per worker process start) under the run's artifacts."""
    base = artifacts.join(artifact_dir, WORKERS_DIR)
    return [artifacts.join(base, os.path.basename(path)) for path in _list_files(base)]


def _read_evaluation(artifact_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO(artifacts.read_bytes(artifacts.join(artifact_dir, EVALUATION_DIR, f"{split}.npz"))),
                 allow_pickle=False) as data:
        return data["y_true"], data["y_pred"]


def run_training(spec: TrainSpec) -> TrainResult:
    """Train the spec's model family on the connected Ray cluster and write its model directory."""
    started = time.monotonic()
    config = spec.resolved_config()
    family = config["family"]
    compute = ComputeSpec.from_dict(spec.compute)
    columns = [*spec.feature_columns, spec.label_column]
    train_rows, label_mean = _label_stats(spec.train_uri, spec.label_column, columns)
    other_rows = sum(_parquet_dataset(uri, columns).num_rows for uri in (spec.validation_uri, spec.test_uri))
    num_workers, sizing_reason = plan_workers(spec, compute, train_rows, (train_rows + other_rows) * len(columns) * 8)
    log.info("right-sizing: %s", sizing_reason)
    affine, preprocessor_uri = scaler_plan(spec.preprocessor_uri, spec.preprocessor_variants, spec.scaler,
                                           spec.feature_columns)
    if affine:
        log.info("scaler %r: features mapped from the written splits with the variant %s", spec.scaler, preprocessor_uri)
    data_loading = spec.data_loading
    if data_loading == "auto":
        data_loading = "ray_data" if num_workers and train_rows >= spec.scale_out_min_rows else "direct"
    model_dir = artifacts.join(spec.artifact_dir, spec.model_subdir)
    uris = dict(zip(SPLITS, (spec.train_uri, spec.validation_uri, spec.test_uri)))
    if num_workers == 0 and not compute.use_gpu and data_loading == "direct":
        # Train's local mode runs the loop in this process anyway: run it without Ray Train, so
        # the job neither connects to Ray nor imports Ray Train (most of a wine-scale run's time).
        artifacts.makedirs(model_dir)
        loop_config = {
            "config": config, "feature_columns": list(spec.feature_columns), "label_column": spec.label_column,
            "label_mean": label_mean, "seed": spec.seed, "use_gpu": False, "local_mode": True,
            "threads": max(1, int(compute.cpus_per_worker)), "checkpoint_every": spec.checkpoint_every,
            "artifact_dir": spec.artifact_dir, "model_dir": model_dir, "uris": uris, "data_loading": data_loading,
            "feature_affine": affine,
        }
        log.info("training %s on CPU in the job's process (Train's local mode without Ray Train), data: direct",
                 family)
        fit_started = time.monotonic()
        loop = lightning_train_loop if family == "lightning" else xgboost_train_loop
        loop(loop_config, InProcessTrainContext())
        return _finish(spec, config, compute, loop_config, label_mean, train_rows, started, preprocessor_uri,
                       fit_s=time.monotonic() - fit_started, runner="in_process", num_workers=0,
                       sizing_reason=sizing_reason, use_gpu=False, gpus_per_worker=0, fallback_reason=None)
    import ray
    import ray.data
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig

    # The operator's job sets Train's report interval (JOB_ENV_VARS); run any other way, set it here
    # so that every report does not wait ~2 s for the controller's poll.
    missing_env = {key: value for key, value in JOB_ENV_VARS.items() if key not in os.environ}
    ray.init(address="auto", logging_level=logging.WARNING,
             runtime_env={"env_vars": missing_env} if missing_env else None)
    use_gpu, gpus_per_worker, fallback_reason = compute.use_gpu, compute.gpus_per_worker, None
    cpus_per_worker = compute.cpus_per_worker
    if use_gpu:
        workers = max(1, num_workers)
        waited = time.monotonic()
        if gpu_placement_available(workers, cpus_per_worker, gpus_per_worker, spec.gpu_placement_timeout_s):
            num_workers = workers  # local mode has no GPU of its own: GPU training runs in workers
        else:
            use_gpu, gpus_per_worker = False, 0
            fallback_reason = (
                f"no placement for {workers} worker(s) x {compute.gpus_per_worker:g} GPU + "
                f"{cpus_per_worker:g} CPU within gpu_placement_timeout_s={spec.gpu_placement_timeout_s:g} s "
                f"(waited {time.monotonic() - waited:.1f} s); training on CPU instead"
            )
            log.warning("GPU fallback: %s", fallback_reason)
    local_mode = num_workers == 0

    artifacts.makedirs(model_dir)
    loop_config = {
        "config": config, "feature_columns": list(spec.feature_columns), "label_column": spec.label_column,
        "label_mean": label_mean, "seed": spec.seed, "use_gpu": use_gpu, "local_mode": local_mode,
        "threads": max(1, int(cpus_per_worker)), "checkpoint_every": spec.checkpoint_every,
        "artifact_dir": spec.artifact_dir, "model_dir": model_dir, "feature_affine": affine,
    }
    loop_config.update(uris=uris, data_loading=data_loading)
    datasets = None
    if data_loading == "ray_data":
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the same rows in the same order: same metrics
        context.enable_progress_bars = False
        datasets = {name: ray.data.read_parquet(uri, columns=columns) for name, uri in uris.items()}
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if use_gpu else {})}
    common = dict(
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker=None if local_mode else resources,
                                     placement_strategy=spec.placement_strategy),
        run_config=RunConfig(
            name=run_name(spec.artifact_dir), storage_path=_storage_path(spec.artifact_dir),
            failure_config=FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=["train"]) if datasets else None,
    )
    log.info("training %s on %s: %s worker(s) x %s (local mode: %s, data: %s), run %s", family,
             "GPU" if use_gpu else "CPU", num_workers, resources, local_mode, data_loading,
             run_name(spec.artifact_dir))
    if family == "lightning":
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(lightning_train_loop, **common)
    else:
        from ray.train.xgboost import XGBoostTrainer

        trainer = XGBoostTrainer(xgboost_train_loop, **common)
    fit_started = time.monotonic()
    trainer.fit()
    return _finish(spec, config, compute, loop_config, label_mean, train_rows, started, preprocessor_uri,
                   fit_s=time.monotonic() - fit_started, runner="ray_train", num_workers=num_workers,
                   sizing_reason=sizing_reason, use_gpu=use_gpu, gpus_per_worker=gpus_per_worker,
                   fallback_reason=fallback_reason)


def _finish(spec: TrainSpec, config: dict[str, Any], compute: ComputeSpec, loop_config: dict[str, Any],
            label_mean: float, train_rows: int, started: float, preprocessor_uri: str | None, *, fit_s: float, runner: str, num_workers: int,
            sizing_reason: str, use_gpu: bool, gpus_per_worker: float, fallback_reason: str | None) -> TrainResult:
    """Metrics, baseline and model card from what the training loop wrote; the stage's result."""
    family, local_mode, data_loading = config["family"], num_workers == 0, loop_config["data_loading"]
    cpus_per_worker, model_dir = compute.cpus_per_worker, loop_config["model_dir"]
    final = artifacts.read_json(artifacts.join(spec.artifact_dir, EVALUATION_DIR, "final.json"))

    metrics = {}
    for split in ("validation", "test"):
        labels, predictions = _read_evaluation(spec.artifact_dir, split)
        metrics[split] = regression_metrics(labels, predictions)
    test_labels, _ = _read_evaluation(spec.artifact_dir, "test")
    baseline = {"test_rmse": regression_metrics(test_labels, np.full_like(test_labels, label_mean))["rmse"],
                "train_label_mean": label_mean}
    worker_records = [artifacts.read_json(f"{uri}") for uri in _worker_record_uris(spec.artifact_dir)]
    worker_starts = len(worker_records)
    compute_used = {
        "use_gpu": use_gpu, "accelerator": "gpu" if use_gpu else "cpu", "device": final.get("device"),
        "num_workers": num_workers, "local_mode": local_mode, "data_loading": data_loading, "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker, "gpu_fallback": fallback_reason is not None,
        "placement_strategy": spec.placement_strategy,
        "worker_nodes": sorted({r["node_id"] for r in worker_records if r.get("node_id")}),
        "fallback_reason": fallback_reason, "sizing_reason": sizing_reason,
        "requested": {key: spec.compute.get(key) for key in ("use_gpu", "num_workers", "cpus_per_worker",
                                                             "gpus_per_worker", "accelerator", "reason")},
    }
    training = {
        **{key: value for key, value in final.items() if key not in ("device",)},
        "train_rows": train_rows, "worker_starts": worker_starts,
        "restarts": max(0, worker_starts - max(1, num_workers)), "run_name": run_name(spec.artifact_dir),
        "checkpoint_every": _checkpoint_every(loop_config), "fit_s": round(fit_s, 3), "runner": runner,
        "stage_s": round(time.monotonic() - started, 3),
    }
    model_version = f"{family}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    if preprocessor_uri:
        artifacts.write_bytes_atomic(artifacts.join(model_dir, PREPROCESSOR), artifacts.read_bytes(preprocessor_uri))
    if spec.scaler:
        config = {**config, "scaler": spec.scaler}  # recorded; the booster never saw it
    card = {
        "family": family, "feature_columns": list(spec.feature_columns), "label_column": spec.label_column,
        "metrics": metrics, "baseline": baseline, "config": config, "data_fingerprint": spec.data_fingerprint,
        "framework_versions": _framework_versions(family), "compute": compute_used,
        "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model_version": model_version,
        "seed": spec.seed, "training": training,
        "preprocessor": PREPROCESSOR if preprocessor_uri else None,
    }
    artifacts.write_json_atomic(artifacts.join(model_dir, MODEL_CARD), card)
    log.info("trained %s %s: test rmse %.4f (baseline %.4f), validation rmse %.4f; %s",
             family, model_version, metrics["test"]["rmse"], baseline["test_rmse"], metrics["validation"]["rmse"],
             json.dumps(training, sort_keys=True))
    return TrainResult(model_dir=model_dir, family=family, metrics=metrics, baseline=baseline, config=config,
                       model_version=model_version, compute_used=compute_used, training=training,
                       data_fingerprint=spec.data_fingerprint)


def main(argv: list[str] | None = None) -> int:
    return run_stage(TrainSpec, run_training, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
