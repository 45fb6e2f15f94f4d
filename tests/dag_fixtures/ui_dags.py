"""DAGs for the "Ray ML" page tests: one live Serve application, and one Tune-shaped result.

``ray_ml_page_serve`` trains one small model and deploys it with the real RayServeDeployOperator,
on its own application so other Serve tests on the same cluster are not touched.

``ray_ml_page_tune`` stands in for the RayTune task until that stage exists: it writes a leaderboard
(JSON and CSV) and a plot in the tune contract's format into ``conf["artifact_dir"]`` and returns
the tune XCom (``leaderboard_json_uri``, ``plot_uri``, ...), through Airflow's own XCom path.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import struct
import zlib
from datetime import datetime

from airflow.sdk import DAG, task

from operators.ray_data import RayDataPreprocessOperator
from operators.ray_job import RayJobOperator
from operators.ray_serve import RayServeDeployOperator
from operators.ray_train import RayTrainOperator

START = datetime(2026, 1, 1)
SPLITS = "ti.xcom_pull('preprocess')"
UI_APP = "wine-ui"
UI_ROUTE = "/wine-ui"

with DAG(dag_id="ray_ml_page_serve", schedule=None, start_date=START, catchup=False,
         render_template_as_native_obj=True):
    data = RayJobOperator(task_id="demo_data", stage="generate", spec={"rows": 1200, "seed": 5},
                          poll_interval_s=0.3)
    preprocess = RayDataPreprocessOperator(task_id="preprocess", label_range=[0, 10], seed=3,
                                           poll_interval_s=0.3)
    train = RayTrainOperator(
        task_id="train", config={"family": "xgboost", "num_boost_round": 8, "eta": 0.1, "max_depth": 3},
        poll_interval_s=0.3,
        train_uri="{{ %s['split_uris']['train'] }}" % SPLITS,
        validation_uri="{{ %s['split_uris']['validation'] }}" % SPLITS,
        test_uri="{{ %s['split_uris']['test'] }}" % SPLITS,
        feature_columns="{{ %s['feature_columns'] }}" % SPLITS,
        preprocessor_uri="{{ %s['preprocessor_uri'] }}" % SPLITS,
        data_fingerprint="{{ %s['fingerprint'] }}" % SPLITS,
    )
    deploy = RayServeDeployOperator(
        task_id="deploy", model="{{ ti.xcom_pull('train') }}",
        test_split_uri="{{ %s['split_uris']['test'] }}" % SPLITS,
        app_name=UI_APP, route_prefix=UI_ROUTE, ready_timeout_s=120, force=True,
    )
    data >> preprocess >> train >> deploy


def _png(width: int, height: int, pixels: bytearray) -> bytes:
    """Encode RGB pixels as a PNG (filter 0 on every row)."""
    rows = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def bar_chart(values: list[float], colours: list[tuple[int, int, int]], width: int = 640, height: int = 240) -> bytes:
    """A bar per value (taller is larger), on white, with a grey axis."""
    pixels = bytearray(b"\xff" * (width * height * 3))

    def fill(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(height, y1)):
            for x in range(max(0, x0), min(width, x1)):
                pixels[(y * width + x) * 3:(y * width + x) * 3 + 3] = bytes(colour)

    top = max(values) or 1.0
    slot = (width - 40) // max(1, len(values))
    for index, (value, colour) in enumerate(zip(values, colours)):
        bar = int((height - 30) * value / top)
        x = 30 + index * slot
        fill(x + 4, height - 20 - bar, x + slot - 4, height - 20, colour)
    fill(20, height - 20, width - 10, height - 18, (120, 120, 120))
    fill(20, 10, 22, height - 18, (120, 120, 120))
    return _png(width, height, pixels)


STATUS_COLOURS = {"COMPLETED": (46, 125, 200), "EARLY_STOPPED": (240, 170, 40), "FAILED": (200, 50, 50)}


def tune_outputs(artifact_dir: str, trials: int = 6, seed: int = 0) -> dict:
    """Write a leaderboard and plot in the tune contract's format; return the tune XCom."""
    rng = random.Random(seed)
    rows = []
    for index in range(trials):
        family = "xgboost" if index % 2 == 0 else "lightning"
        status = "FAILED" if index == trials - 1 else ("EARLY_STOPPED" if index % 3 == 1 else "COMPLETED")
        config = ({"max_depth": rng.randint(2, 8), "eta": round(rng.uniform(0.02, 0.3), 3)} if family == "xgboost"
                  else {"hidden_sizes": [rng.choice([16, 32, 64])], "lr": round(rng.uniform(1e-4, 1e-2), 5)})
        rmse = None if status == "FAILED" else round(rng.uniform(0.6, 0.9), 4)
        rows.append({
            "trial_id": f"trial_{index:05d}_{rng.randrange(16 ** 4):04x}", "family": family, "scaler": "standard",
            "config": {"family": family, **config},
            "metrics": {} if rmse is None else {"val_rmse": rmse, "val_mae": round(rmse * 0.78, 4),
                                                "val_acc_0_5": round(1.1 - rmse, 4), "val_acc_1_0": round(1.5 - rmse, 4)},
            "status": status, "iterations": 0 if status == "FAILED" else rng.randint(3, 20),
            "time_s": round(rng.uniform(1, 9), 2), "error": "worker died" if status == "FAILED" else None,
        })
    rows.sort(key=lambda row: row["metrics"].get("val_rmse", float("inf")))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    best = rows[0]
    os.makedirs(artifact_dir, exist_ok=True)
    paths = {name: os.path.join(artifact_dir, name) for name in ("leaderboard.json", "leaderboard.csv", "trials.png")}
    with open(paths["leaderboard.json"], "w") as handle:
        json.dump(rows, handle)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["rank", "trial_id", "family", "status", "val_rmse"])
    for row in rows:
        writer.writerow([row["rank"], row["trial_id"], row["family"], row["status"], row["metrics"].get("val_rmse")])
    with open(paths["leaderboard.csv"], "w") as handle:
        handle.write(buffer.getvalue())
    scored = [row for row in rows if "val_rmse" in row["metrics"]]
    with open(paths["trials.png"], "wb") as handle:
        handle.write(bar_chart([row["metrics"]["val_rmse"] for row in scored],
                               [STATUS_COLOURS[row["status"]] for row in scored]))
    counts = {status: sum(row["status"] == status for row in rows) for status in STATUS_COLOURS}
    return {
        "stage": "tune", "status": "succeeded", "artifact_dir": artifact_dir,
        "best_config": best["config"], "best_trial_id": best["trial_id"], "metric": "val_rmse", "mode": "min",
        "best_metric": best["metrics"]["val_rmse"], "best_checkpoint_uri": os.path.join(artifact_dir, "best"),
        "leaderboard_json_uri": paths["leaderboard.json"], "leaderboard_csv_uri": paths["leaderboard.csv"],
        "plot_uri": paths["trials.png"],
        "trials": {"total": len(rows), "completed": counts["COMPLETED"], "failed": counts["FAILED"],
                   "early_stopped": counts["EARLY_STOPPED"]},
        "searcher": "optuna", "scheduler": "asha", "time_s": round(sum(row["time_s"] for row in rows), 2),
    }


with DAG(dag_id="ray_ml_page_tune", schedule=None, start_date=START, catchup=False):

    @task(task_id="tune")
    def tune(**context) -> dict:
        conf = context["dag_run"].conf
        context["ti"].xcom_push(key="ray_job", value={
            "dashboard_url": conf["dashboard_url"], "submission_id": "airflow-ray_ml_page_tune-tune-0",
            "job_url": f"{conf['dashboard_url']}/#/jobs/airflow-ray_ml_page_tune-tune-0"})
        return tune_outputs(conf["artifact_dir"], trials=int(conf.get("trials", 6)), seed=int(conf.get("seed", 0)))

    tune()
