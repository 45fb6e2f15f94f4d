"""Two DAGs whose ``tune`` task leaves what a RayTune task leaves, without Ray: for the page's access tests.

Each ``tune`` task writes a two-row leaderboard and a small PNG plot into the run's
``artifact_dir`` (a Param), records a Ray job link under the stage operators' XCom key, and returns
a Tune-shaped manifest with ``multiple_outputs=True``, as RayTuneOperator does, so every manifest
key (``leaderboard_json_uri`` among them) is an XCom of its own. Trial ids name the DAG, and the
job's submission id is the one a stage operator would give this task run (it names the DAG and
hashes the run), so a page shows whose run it found; no such job runs anywhere.
"""

from __future__ import annotations

import json
import struct
import zlib
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, get_current_context, task

from airflow_ray_ml.job_status import base_submission_id
from airflow_ray_ml.links.ray import RAY_JOB_XCOM_KEY

DAG_IDS = ("ray_ml_page_access_a", "ray_ml_page_access_b")
DASHBOARD = "http://127.0.0.1:8265"


def png(width: int, height: int) -> bytes:
    """A valid grey PNG of the given size."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    scanlines = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(scanlines)) + chunk(b"IEND", b""))


def plot_width(dag_id: str) -> int:
    """Each DAG's plot has its own width, so a test can tell whose plot it was served."""
    return 3 + DAG_IDS.index(dag_id)


@task(multiple_outputs=True)
def tune() -> dict:
    context = get_current_context()
    dag_id, run_id = context["dag"].dag_id, context["run_id"]
    out = Path(context["params"]["artifact_dir"]) / dag_id
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"rank": rank, "trial_id": f"{dag_id}-trial-{rank}", "family": "xgboost", "scaler": "standard",
             "metrics": {"val_rmse": 0.5 + rank / 10}, "status": "COMPLETED", "config": {"max_depth": rank}}
            for rank in (1, 2)]
    (out / "leaderboard.json").write_text(json.dumps(rows))
    (out / "plot.png").write_bytes(png(plot_width(dag_id), 2))
    submission_id = base_submission_id(dag_id, run_id, "tune")
    context["ti"].xcom_push(key=RAY_JOB_XCOM_KEY, value={
        "dashboard_url": DASHBOARD, "submission_id": submission_id, "job_url": f"{DASHBOARD}/#/jobs/{submission_id}"})
    return {"status": "succeeded", "best_trial_id": rows[0]["trial_id"], "metric": "val_rmse", "mode": "min",
            "best_metric": rows[0]["metrics"]["val_rmse"], "best_config": rows[0]["config"],
            "leaderboard_json_uri": str(out / "leaderboard.json"), "plot_uri": str(out / "plot.png"),
            "trials": {"total": 2, "completed": 2, "failed": 0, "early_stopped": 0}}


for _dag_id in DAG_IDS:
    with DAG(dag_id=_dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             params={"artifact_dir": Param("", type="string")}):
        tune()
