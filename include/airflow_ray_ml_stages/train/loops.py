"""The training loops: a Lightning MLP and an XGBoost booster, each checkpointing and resumable, and
scikit-learn's forests and linear model (one process, no checkpoint: they train in seconds to minutes).

The first two run unchanged in a Ray Train worker, a Ray Tune trial or the job's own process (see
:mod:`airflow_ray_ml_stages.train.contexts`); rank 0 evaluates the trained model and writes its weights into the
model directory and its predictions into the run's files (:mod:`airflow_ray_ml_stages.train.run_dir`).
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.metrics import validation_metrics
from airflow_ray_ml_stages.models import (
    TORCH_CONFIG, TORCH_WEIGHTS, XGBOOST_MODEL, class_probabilities, xgboost_feature_names,
)
from airflow_ray_ml_stages.models.forest import FOREST_MODEL, forest_bytes
from airflow_ray_ml_stages.train.contexts import RayTrainContext, loop_context
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig
from airflow_ray_ml_stages.train.run_dir import announce_worker, write_evaluation, write_final
from airflow_ray_ml_stages.train.splits import split_arrays, start_reading_train_split, tensor_batches


def tune_report(step: dict[str, Any], task: str, labels: np.ndarray, predictions: np.ndarray) -> None:
    """Report a trial's validation metrics now to Ray Tune."""
    from ray import tune

    metrics = validation_metrics(task, labels, predictions)
    # Tune's own "timestamp" has whole seconds: too coarse to plot short trials over time.
    tune.report({**metrics, **step, "reported_at": time.time()})


def _no_sigterm_broadcast_callback(pl):
    class NoSigtermBroadcast(pl.Callback):
        """Drop Lightning's per-step SIGTERM broadcast between the ranks in a Ray Train run.

        With several ranks Lightning broadcasts a SIGTERM flag from rank 0 before every step, a
        second collective beside DDP's gradient all-reduce: one more point per step where each rank
        waits for the slowest. Ray Train handles a stopped worker itself (the controller restarts
        the group from the last checkpoint), so the flag has no use here.
        """

        def on_train_start(self, trainer, pl_module):
            epoch_loop = trainer.fit_loop.epoch_loop
            if hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
                epoch_loop._broadcast_sigterm_tensor = lambda: None

    return NoSigtermBroadcast()


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    """Rank 0's phase times (read the splits, fit, evaluate and write), as the manifest's ``training.loop_timings``."""
    return {name: round(seconds, 3) for name, seconds in timings.items()}


# -- Lightning ---------------------------------------------------------------------------------


def lightning_train_loop(cfg: TrainLoopConfig | dict[str, Any], context: Any = None) -> None:
    """Lightning MLP with early stopping and checkpoints.

    Runs in Ray Train workers (``TorchTrainer`` with ``RayDDPStrategy``; ``context`` None) or, for a
    small CPU run, in the job's own process with an :class:`InProcessTrainContext`.
    """
    cfg = TrainLoopConfig.of(cfg)  # Ray Train hands the workers its dict
    context = loop_context(cfg, context)
    in_ray_train = isinstance(context, RayTrainContext)
    rank, world_size = context.get_world_rank(), context.get_world_size()
    announce_worker(cfg, rank)
    timings, phase_started = {}, time.monotonic()
    train_arrays = start_reading_train_split(cfg, rank, world_size)  # while torch and Lightning import

    import torch

    from airflow_ray_ml_stages.models.lightning_package import import_lightning, lightning_versions
    from airflow_ray_ml_stages.models.mlp import label_offset, label_scale, lightning_module, model_config

    pl = import_lightning()  # the package Ray's Lightning classes below come from too

    config, features, label, seed = cfg.config, cfg.feature_columns, cfg.label_column, cfg.seed
    pl.seed_everything(seed, workers=True, verbose=False)
    torch.set_num_threads(cfg.threads)

    val_x, val_y = split_arrays(cfg, "validation")
    train_x, train_y = train_arrays()
    timings["read_s"] = time.monotonic() - phase_started  # imports included: the read overlaps them
    # Each rank already holds its own part of the training rows (its Ray Data shard, or its slice of
    # a direct read), so Lightning must not put a DistributedSampler in front of them, which would
    # train every rank on 1/world_size of its part. The sampler is the DataLoader's own shuffle,
    # seeded per rank: one worker sees the batches the job's process sees.
    train_loader = tensor_batches(train_x, train_y, config["batch_size"], shuffle=True,
                                  generator=torch.Generator().manual_seed(seed + rank))
    val_loader = tensor_batches(val_x, val_y, 4096)
    offset, scale = label_offset(cfg.label_mean, cfg.class_priors), label_scale(cfg.label_std, cfg.class_priors)
    module = lightning_module(config, len(features), offset, scale)

    def predict(net, x: np.ndarray) -> np.ndarray:
        """The net's predictions: values, or (classification) class probabilities."""
        return net.predict(torch.from_numpy(x).to(next(net.parameters()).device)).cpu().numpy()

    every = cfg.checkpoint_interval()
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
                predicted = predict(pl_module.model, val_x)
            pl_module.train(was_training)
            tune_report({"epoch": trainer.current_epoch + 1}, cfg.task, val_y, predicted)

    if context.tune:
        callbacks.append(TuneReportEveryCallback())
    if not cfg.local_mode:
        callbacks.append(_no_sigterm_broadcast_callback(pl))
    if config["patience"]:
        callbacks.append(pl.callbacks.EarlyStopping(monitor="val_loss", patience=config["patience"], mode="min"))
    local_mode = cfg.local_mode
    if not local_mode:
        from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        accelerator="gpu" if cfg.use_gpu else "cpu",
        devices="auto" if not local_mode else 1,
        # The MLP's one buffer (the label offset) never changes: no broadcast of it before every step.
        strategy="auto" if local_mode else RayDDPStrategy(broadcast_buffers=False),
        plugins=None if local_mode else [RayLightningEnvironment()],
        use_distributed_sampler=False,
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
    phase_started = time.monotonic()
    checkpoint = context.get_checkpoint()
    if checkpoint:
        from ray.train.lightning import RayTrainReportCallback

        with checkpoint.as_directory() as directory:
            path = os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME)
            resumed_from_epoch = int(torch.load(path, map_location="cpu", weights_only=True)["epoch"]) + 1
            print(f"airflow_ray_ml_stages.train: worker rank {rank} (pid {os.getpid()}) resumes from the checkpoint "
                  f"after epoch {resumed_from_epoch}", flush=True)
            trainer.fit(module, train_loader, val_loader, ckpt_path=path, weights_only=True)
    else:
        trainer.fit(module, train_loader, val_loader)

    timings["fit_s"] = time.monotonic() - phase_started
    final = {"epochs_run": int(trainer.current_epoch), "resumed_from_epoch": resumed_from_epoch,
             "device": str(trainer.strategy.root_device),
             "best_val_loss": float(trainer.callback_metrics.get("val_loss", float("nan"))),
             "train_rows_per_worker": int(len(train_x)), "world_size": world_size,
             "framework_versions": {"torch": torch.__version__, **lightning_versions(pl)}}
    if rank == 0:
        phase_started = time.monotonic()
        net = module.model.to("cpu").eval()
        evaluated = {"validation": (val_x, val_y)}
        if "test" in context.evaluation_splits():
            evaluated["test"] = split_arrays(cfg, "test")
        with torch.inference_mode():
            for split, (x, y) in evaluated.items():
                write_evaluation(cfg, split, y, predict(net, x))
        buffer = io.BytesIO()
        torch.save({name: tensor.detach().cpu().clone() for name, tensor in net.state_dict().items()}, buffer)
        artifacts.write_bytes_atomic(artifacts.join(cfg.model_dir, TORCH_WEIGHTS), buffer.getvalue())
        artifacts.write_json_atomic(
            artifacts.join(cfg.model_dir, TORCH_CONFIG),
            model_config(len(features), config["hidden_sizes"], config["dropout"], offset, scale),
        )
        timings["evaluate_s"] = time.monotonic() - phase_started
        write_final(cfg, {**final, "loop_timings": _rounded(timings)})


# -- XGBoost -----------------------------------------------------------------------------------


def xgboost_train_loop(cfg: TrainLoopConfig | dict[str, Any], context: Any = None) -> None:
    """XGBoost training loop, checkpoints every N rounds, resumable.

    Runs in Ray Train workers (V2 ``XGBoostTrainer``; ``context`` None), in a Ray Tune trial
    (``cfg.session == "tune"``) or, for a small CPU run, in the job's own process with an
    :class:`InProcessTrainContext`.
    """
    cfg = TrainLoopConfig.of(cfg)  # Ray Train hands the workers its dict
    context = loop_context(cfg, context)
    rank, world_size = context.get_world_rank(), context.get_world_size()
    announce_worker(cfg, rank)
    config, label = cfg.config, cfg.label_column
    features = xgboost_feature_names(cfg.feature_columns)

    timings, phase_started = {}, time.monotonic()
    train_arrays = start_reading_train_split(cfg, rank, world_size)  # while xgboost imports

    import xgboost

    val_x, val_y = split_arrays(cfg, "validation")
    train_x, train_y = train_arrays()
    timings["read_s"] = time.monotonic() - phase_started
    dtrain = xgboost.DMatrix(train_x, label=train_y, feature_names=features)
    dvalidation = xgboost.DMatrix(val_x, label=val_y, feature_names=features)
    booster_keys = {"num_boost_round", "early_stopping_rounds", "family"}
    classes = None if cfg.class_priors is None else len(cfg.class_priors)
    if classes is None:
        objective = {"objective": "reg:squarederror", "eval_metric": "rmse", "base_score": cfg.label_mean}
    elif classes == 2:
        objective = {"objective": "binary:logistic", "eval_metric": "logloss"}
    else:
        objective = {"objective": "multi:softprob", "eval_metric": "mlogloss", "num_class": classes}
    params = {
        **objective, "tree_method": "hist", "seed": cfg.seed, "nthread": cfg.threads,
        "device": "cuda" if cfg.use_gpu else "cpu",
        **{key: value for key, value in config.items() if key not in booster_keys},
    }

    def predict(model, matrix) -> np.ndarray:
        """The booster's predictions: values, or (classification) class probabilities."""
        predicted = model.predict(matrix)
        return predicted if classes is None else class_probabilities(predicted, classes)
    every = cfg.checkpoint_interval()

    class ReportEveryCallback(xgboost.callback.TrainingCallback):
        """Report (with a checkpoint in XGBoost's own format) every ``every`` rounds, not each one."""

        def after_iteration(self, model, epoch, evals_log):
            rounds = model.num_boosted_rounds()
            if rounds % every == 0 and context.tune:
                tune_report({"round": rounds}, cfg.task, val_y, predict(model, dvalidation))
            elif rounds % every == 0:
                metric = params["eval_metric"]
                metrics = {"round": rounds, f"validation_{metric}": float(evals_log["validation"][metric][-1])}
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
        print(f"airflow_ray_ml_stages.train: worker rank {rank} (pid {os.getpid()}) resumes from the checkpoint "
              f"after round {resumed_from_round}", flush=True)
    remaining = config["num_boost_round"] - (resumed_from_round or 0)
    phase_started = time.monotonic()
    booster = xgboost.train(
        params, dtrain, num_boost_round=max(0, remaining), evals=[(dvalidation, "validation")],
        early_stopping_rounds=config["early_stopping_rounds"] or None, xgb_model=start_booster,
        callbacks=[ReportEveryCallback()], verbose_eval=False,
    )
    rounds_run = booster.num_boosted_rounds()
    best = getattr(booster, "best_iteration", None)
    if config["early_stopping_rounds"] and best is not None and best + 1 < rounds_run:
        booster = booster[: best + 1]  # keep the best rounds, as early stopping intends
    timings["fit_s"] = time.monotonic() - phase_started
    phase_started = time.monotonic()
    final = {"rounds_run": rounds_run, "rounds_kept": booster.num_boosted_rounds(),
             "resumed_from_round": resumed_from_round, "device": params["device"],
             "train_rows_per_worker": int(len(train_x)), "world_size": world_size}
    # Every rank builds the evaluation DMatrix: with several workers, DMatrix construction is a
    # collective operation, and rank 0 alone would wait for the others.
    evaluated = {"validation": (val_x, val_y)}
    if "test" in context.evaluation_splits():
        evaluated["test"] = split_arrays(cfg, "test")
    predictions = {split: (y, predict(booster, xgboost.DMatrix(x, feature_names=features)))
                   for split, (x, y) in evaluated.items()}
    if rank == 0:
        for split, (y, predicted) in predictions.items():
            write_evaluation(cfg, split, y, predicted)
        artifacts.write_bytes_atomic(artifacts.join(cfg.model_dir, XGBOOST_MODEL), bytes(booster.save_raw("ubj")))
        timings["evaluate_s"] = time.monotonic() - phase_started
        write_final(cfg, {**final, "loop_timings": _rounded(timings)})


# -- scikit-learn: the forests and the linear model ------------------------------------------------


def forest_estimator(family: str, config: dict[str, Any], classification: bool, seed: int, threads: int):
    """The unfitted scikit-learn forest of ``family`` (``extra_trees``, ``random_forest``) for ``config``."""
    from sklearn import ensemble

    kind = {"extra_trees": "ExtraTrees", "random_forest": "RandomForest"}[family]
    estimator = getattr(ensemble, f"{kind}{'Classifier' if classification else 'Regressor'}")
    return estimator(n_estimators=int(config["n_estimators"]), max_features=float(config["max_features"]),
                     min_samples_leaf=int(config["min_samples_leaf"]), max_depth=int(config["max_depth"]) or None,
                     n_jobs=threads, random_state=seed)


def _fitted_once(cfg: TrainLoopConfig, context: Any, fit: Any) -> None:
    """The scikit-learn families' loop: read the splits, fit once, evaluate, write the model file.

    Runs in the job's own process or a Ray Tune trial, on the CPU; in a trial it reports once, its
    final model's metrics. ``fit(train_x, train_y, classes)`` fits the family's model on the
    training rows (``classes``: their number, None for a regression) and returns the model file's
    name and bytes, what the model predicts for an array of features (values, or every class's
    probability), and what the final report adds.
    """
    announce_worker(cfg, 0)
    timings, phase_started = {}, time.monotonic()
    train_arrays = start_reading_train_split(cfg, 0, 1)  # while scikit-learn imports
    import sklearn

    classes = None if cfg.class_priors is None else len(cfg.class_priors)
    val_x, val_y = split_arrays(cfg, "validation")
    train_x, train_y = train_arrays()
    timings["read_s"] = time.monotonic() - phase_started
    phase_started = time.monotonic()
    name, data, predict, final = fit(train_x, train_y.astype(np.int64) if classes else train_y.astype(np.float64),
                                     classes)
    timings["fit_s"] = time.monotonic() - phase_started
    phase_started = time.monotonic()
    evaluated = {"validation": (val_x, val_y)}
    if "test" in context.evaluation_splits():
        evaluated["test"] = split_arrays(cfg, "test")
    for split, (x, y) in evaluated.items():
        write_evaluation(cfg, split, y, predict(x))
    artifacts.write_bytes_atomic(artifacts.join(cfg.model_dir, name), data)
    timings["evaluate_s"] = time.monotonic() - phase_started
    write_final(cfg, {**final, "device": "cpu", "train_rows_per_worker": int(len(train_x)), "world_size": 1,
                      "framework_versions": {"scikit-learn": sklearn.__version__},
                      "loop_timings": _rounded(timings)})


def forest_train_loop(cfg: TrainLoopConfig | dict[str, Any], context: Any = None) -> None:
    """A scikit-learn forest, grown in one go; it writes ``forest.npz`` (:mod:`airflow_ray_ml_stages.models.forest`).

    The forests have no GPU implementation. A trial reports only its end, so ASHA never stops a
    forest: one trains in seconds, a part of its trees says little of the whole, and a completed
    trial is one more model the ensemble selection can use.
    """
    cfg = TrainLoopConfig.of(cfg)
    context = loop_context(cfg, context)

    def fit(x: np.ndarray, y: np.ndarray, classes: int | None):
        forest = forest_estimator(cfg.family, cfg.config, classes is not None, cfg.seed, cfg.threads).fit(x, y)

        def predict(features: np.ndarray) -> np.ndarray:
            if classes is None:
                return forest.predict(features)
            found = np.zeros((len(features), classes))  # a class missing from training: probability 0
            found[:, forest.classes_.astype(np.int64)] = forest.predict_proba(features)
            return found

        return FOREST_MODEL, forest_bytes(forest, classes), predict, {"trees": int(cfg.config["n_estimators"])}

    _fitted_once(cfg, context, fit)


def linear_train_loop(cfg: TrainLoopConfig | dict[str, Any], context: Any = None) -> None:
    """A linear model: ridge regression, or logistic regression (``C = 1 / alpha``) for classes.

    Fitted once on the CPU, missing features imputed (``feature_fill``); it writes ``linear.npz``
    (:mod:`airflow_ray_ml_stages.models.linear`) and is evaluated from that file, as it is served.
    """
    cfg = TrainLoopConfig.of(cfg)
    context = loop_context(cfg, context)

    def fit(x: np.ndarray, y: np.ndarray, classes: int | None):
        from sklearn.linear_model import LogisticRegression, Ridge

        from airflow_ray_ml_stages.models.linear import LINEAR_MODEL, linear_bytes, linear_predict

        alpha = float(cfg.config["alpha"])
        model = Ridge(alpha=alpha) if classes is None else LogisticRegression(C=1.0 / alpha, max_iter=2000)
        data = linear_bytes(model.fit(x.astype(np.float64), y), classes)
        return LINEAR_MODEL, data, lambda features: linear_predict(data, features), {}

    _fitted_once(cfg, context, fit)


TRAIN_LOOPS = {"lightning": lightning_train_loop, "xgboost": xgboost_train_loop,
               "extra_trees": forest_train_loop, "random_forest": forest_train_loop, "linear": linear_train_loop}
"""Each family's training loop."""
