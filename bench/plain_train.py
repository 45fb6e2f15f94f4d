"""The baseline for bench_train.py and bench_gpu.py: plain Lightning, a plain PyTorch loop or plain
XGBoost on the same splits, no Ray, on CPU or (``--device cuda``) on the GPU.

Run in a fresh process (imports included in the time), like the Ray job it is compared with.
Prints one JSON line: test RMSE and the training time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

STARTED = time.monotonic()
FIT_S = {}  # the training call alone (trainer.fit / xgboost.train), as the stage's loop_timings.fit_s
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "include")]

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _arrays(path: str, features: list[str], label: str):
    frame = pd.read_parquet(path, columns=[*features, label])
    return frame[features].to_numpy(np.float32), frame[label].to_numpy(np.float32)


def plain_lightning(splits: dict, features: list[str], label: str, epochs: int, seed: int,
                    batch_size: int | None = None, whole_batches: bool = False, processes: int = 1,
                    device: str = "cpu", threads: int = 1) -> np.ndarray:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from airflow_ray_ml_stages.models.lightning_package import import_lightning
    from airflow_ray_ml_stages.models.mlp import label_scale, lightning_module

    pl = import_lightning()  # the package lightning_module's LightningModule comes from
    from airflow_ray_ml_stages.specs import LIGHTNING_DEFAULTS

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    (train_x, train_y), (val_x, val_y), (test_x, _) = (_arrays(splits[s], features, label) for s in ("train", "validation", "test"))
    label_mean, label_std = float(train_y.mean()), float(train_y.std())
    # Several processes: Lightning's own DDP over gloo on this machine's CPUs, no Ray. Each rank
    # trains on its equal slice of the rows, as the stage's workers do with their shards. Lightning
    # starts ranks 1.. by running this script again with LOCAL_RANK set.
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if processes > 1:
        rows = len(train_x) // processes
        train_x, train_y = train_x[rank::processes][:rows], train_y[rank::processes][:rows]
    FIT_S["train_rows_per_process"] = len(train_x)
    config = {**LIGHTNING_DEFAULTS, "max_epochs": epochs, "batch_size": batch_size or LIGHTNING_DEFAULTS["batch_size"]}
    module = lightning_module(config, len(features), label_mean, label_scale(label_std, None))
    ddp = {"strategy": "ddp", "devices": processes, "use_distributed_sampler": False} if processes > 1 else {"devices": 1}
    trainer = pl.Trainer(max_epochs=epochs, accelerator="gpu" if device == "cuda" else "cpu", **ddp, logger=False,
                         enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         deterministic=True)
    if whole_batches:  # the stage's loader: the same batches, one tensor index per batch
        from airflow_ray_ml_stages.train.splits import tensor_batches

        loaders = (tensor_batches(train_x, train_y, config["batch_size"], shuffle=True,
                                  generator=torch.Generator().manual_seed(seed + rank)),
                   tensor_batches(val_x, val_y, 4096))
    else:
        loaders = (DataLoader(TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y)),
                              batch_size=config["batch_size"], shuffle=True, generator=torch.Generator().manual_seed(seed)),
                   DataLoader(TensorDataset(torch.from_numpy(val_x), torch.from_numpy(val_y)), batch_size=4096))
    fit_started = time.monotonic()
    trainer.fit(module, *loaders)
    FIT_S["fit_s"] = time.monotonic() - fit_started
    if rank:
        sys.exit(0)  # rank 0 evaluates and prints the result
    with torch.inference_mode():
        return module.model.to("cpu").eval()(torch.from_numpy(test_x)).numpy()


def plain_torch(splits: dict, features: list[str], label: str, epochs: int, seed: int,
                batch_size: int | None = None, device: str = "cpu", threads: int = 1) -> np.ndarray:
    """The stage's MLP, loss and optimiser in a hand-written loop: the tables on the device once, a
    shuffled index per epoch, the validation loss after each epoch (as Lightning computes it)."""
    import torch

    from airflow_ray_ml_stages.models.mlp import MLP, label_scale
    from airflow_ray_ml_stages.specs import LIGHTNING_DEFAULTS

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    (train_x, train_y), (val_x, val_y), (test_x, _) = (_arrays(splits[s], features, label) for s in ("train", "validation", "test"))
    config = {**LIGHTNING_DEFAULTS, "batch_size": batch_size or LIGHTNING_DEFAULTS["batch_size"]}
    scale = label_scale(float(train_y.std()), None)
    model = MLP(len(features), config["hidden_sizes"], config["dropout"], float(train_y.mean()), scale).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    train_x, train_y, val_x, val_y = (torch.from_numpy(array).to(device) for array in (train_x, train_y, val_x, val_y))
    generator = torch.Generator(device=device).manual_seed(seed)
    fit_started = time.monotonic()
    for _ in range(epochs):
        model.train()
        for batch in torch.randperm(len(train_x), device=device, generator=generator).split(config["batch_size"]):
            loss = torch.nn.functional.mse_loss(model(train_x[batch]), train_y[batch]) / scale ** 2
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
        model.eval()
        with torch.inference_mode():
            float(torch.nn.functional.mse_loss(model(val_x), val_y))  # one sync per epoch, as Lightning's
    FIT_S["fit_s"] = time.monotonic() - fit_started
    with torch.inference_mode():
        return model.to("cpu").eval()(torch.from_numpy(test_x)).numpy()


def plain_xgboost(splits: dict, features: list[str], label: str, rounds: int, seed: int, device: str = "cpu",
                  threads: int = 1) -> np.ndarray:
    import xgboost

    from airflow_ray_ml_stages.specs import XGBOOST_DEFAULTS

    (train_x, train_y), (val_x, val_y), (test_x, _) = (_arrays(splits[s], features, label) for s in ("train", "validation", "test"))
    params = {key: value for key, value in XGBOOST_DEFAULTS.items() if key not in ("num_boost_round", "early_stopping_rounds")}
    params.update(objective="reg:squarederror", eval_metric="rmse", tree_method="hist", seed=seed, nthread=threads,
                  base_score=float(train_y.mean()), device=device)
    fit_started = time.monotonic()
    booster = xgboost.train(params, xgboost.DMatrix(train_x, label=train_y, feature_names=features), rounds,
                            evals=[(xgboost.DMatrix(val_x, label=val_y, feature_names=features), "validation")],
                            verbose_eval=False)
    FIT_S["fit_s"] = time.monotonic() - fit_started
    return booster.predict(xgboost.DMatrix(test_x, feature_names=features))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=("lightning", "torch", "xgboost"), required=True,
                        help="torch: the stage's MLP in a plain PyTorch loop")
    parser.add_argument("--splits", required=True, help="JSON: train/validation/test Parquet paths")
    parser.add_argument("--features", required=True, help="JSON list of feature columns")
    parser.add_argument("--label", default="quality")
    parser.add_argument("--iterations", type=int, required=True, help="epochs or boosting rounds")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, help="Lightning batch size (default: the stage's default)")
    parser.add_argument("--whole-batches", action="store_true",
                        help="Lightning: the stage's whole-batch tensor loader instead of DataLoader(TensorDataset)")
    parser.add_argument("--processes", type=int, default=1,
                        help="Lightning: train in this many DDP processes (gloo, one thread each), without Ray")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch, XGBoost)")
    parser.add_argument("--result", required=True,
                        help="file for the JSON result (stdout is shared with Lightning's and torch's own output)")
    args = parser.parse_args()
    splits, features = json.loads(args.splits), json.loads(args.features)
    on = {"device": args.device, "threads": args.threads}
    if args.family == "lightning":
        predictions = plain_lightning(splits, features, args.label, args.iterations, args.seed, args.batch_size,
                                      args.whole_batches, args.processes, **on)
    elif args.family == "torch":
        predictions = plain_torch(splits, features, args.label, args.iterations, args.seed, args.batch_size, **on)
    else:
        predictions = plain_xgboost(splits, features, args.label, args.iterations, args.seed, **on)
    test_y = pd.read_parquet(splits["test"], columns=[args.label])[args.label].to_numpy(np.float64)
    rmse = float(np.sqrt(np.mean((predictions - test_y) ** 2)))
    Path(args.result).write_text(json.dumps({
        "family": args.family, "test_rmse": rmse, "seconds": time.monotonic() - STARTED,
        "train_rows": int(pd.read_parquet(splits["train"], columns=[args.label]).shape[0]), **FIT_S}))


if __name__ == "__main__":
    main()
