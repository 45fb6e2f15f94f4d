"""A training run's files under its artifact directory, written in the loop and read by the driver.

Each loop writes its predictions per split (``evaluation/<split>.npz``) and ``final.json``
(epochs or rounds run, the device), and every worker process a record (``workers/``) from which
the driver counts restarts. Ray Train keeps the run's checkpoints under ``train_runs/<run name>``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TEST_PREDICTIONS_NAME
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig


EVALUATION_DIR = "evaluation"
WORKERS_DIR = "workers"
TRAIN_RUNS_DIR = "train_runs"


def announce_worker(cfg: TrainLoopConfig, rank: int) -> None:
    """Record this worker process (pid, rank, node, start time): operators and tests find workers here."""
    ray = sys.modules.get("ray")  # never imported just for this: the in-process runner runs without Ray
    node_id = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    record = {"pid": os.getpid(), "rank": rank, "host": platform.node(), "node_id": node_id, "started": time.time()}
    uri = artifacts.join(cfg.artifact_dir, WORKERS_DIR, f"rank{rank}-pid{os.getpid()}.json")
    artifacts.write_json_atomic(uri, record)


def write_evaluation(cfg: TrainLoopConfig, split: str, labels: np.ndarray, predictions: np.ndarray) -> None:
    """A split's labels and predictions, as ``evaluation/<split>.npz``."""
    write_split_evaluation(cfg.artifact_dir, split, labels, predictions)


def write_split_evaluation(artifact_dir: str, split: str, labels: np.ndarray, predictions: np.ndarray) -> None:
    """:func:`write_evaluation` into ``artifact_dir``."""
    buffer = io.BytesIO()
    np.savez(buffer, y_true=labels.astype(np.float64), y_pred=predictions.astype(np.float64))
    artifacts.write_bytes_atomic(artifacts.join(artifact_dir, EVALUATION_DIR, f"{split}.npz"), buffer.getvalue())


def write_test_predictions(model_dir: str, task: str, labels: np.ndarray, predictions: np.ndarray) -> None:
    """The model's answer to each test row, beside its card (``TEST_PREDICTIONS_NAME``), for the deploy gate."""
    kept = {"task": task, "labels": np.asarray(labels, dtype=np.float64).tolist(),
            "predictions": np.asarray(predictions, dtype=np.float64).tolist()}
    artifacts.write_bytes_atomic(artifacts.join(model_dir, TEST_PREDICTIONS_NAME),
                                 json.dumps(kept, separators=(",", ":")).encode())


def write_final(cfg: TrainLoopConfig, final: dict[str, Any]) -> None:
    """What the loop ran (epochs or rounds, the device), as ``evaluation/final.json``."""
    artifacts.write_json_atomic(artifacts.join(cfg.artifact_dir, EVALUATION_DIR, "final.json"), final)


def read_final(artifact_dir: str) -> dict[str, Any]:
    """What :func:`write_final` wrote into ``artifact_dir``."""
    return artifacts.read_json(artifacts.join(artifact_dir, EVALUATION_DIR, "final.json"))


def read_evaluation(artifact_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's labels and predictions, as :func:`write_evaluation` wrote them."""
    with np.load(io.BytesIO(artifacts.read_bytes(artifacts.join(artifact_dir, EVALUATION_DIR, f"{split}.npz"))),
                 allow_pickle=False) as data:
        return data["y_true"], data["y_pred"]


def worker_record_uris(artifact_dir: str) -> list[str]:
    """URIs of the worker records (one per worker process start) under the run's artifacts."""
    base = artifacts.join(artifact_dir, WORKERS_DIR)
    return [artifacts.join(base, name) for name in artifacts.list_files(base)]


def run_name(artifact_dir: str) -> str:
    """The Ray Train run name: unique per Airflow task run (a retry of it resumes the same run)."""
    return "train-" + hashlib.sha1(artifact_dir.encode("utf-8")).hexdigest()[:16]


def storage_path(artifact_dir: str) -> str:
    """Where Ray Train keeps the run's checkpoints: ``train_runs/`` under the artifact directory."""
    return artifacts.ray_storage_path(artifacts.join(artifact_dir, TRAIN_RUNS_DIR))
