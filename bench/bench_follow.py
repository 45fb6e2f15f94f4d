"""How soon a task learns that its Ray job has ended: Ray's own log stream vs the hook's follower.

Every stage task follows its job through ``RayHook.tail_job_logs`` (the operator's wait, and the
trigger's through the async twin). Ray's tail websocket closes seconds after a job ends, so the
follower also reads the job's state every ``status_poll_s`` and ends once the job has. This bench
submits the same small job again and again to one local 2-CPU cluster and follows each, the ways
interleaved, measuring the seconds from the job's ``end_time`` (Ray's) to the follower's return,
and from the submit to it.

Run: ``.venv/bin/python bench/bench_follow.py [--jobs 6] [--job-seconds 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402

CONN_ID = "ray_bench_follow"
# Ray's own end of the stream: a state read that never comes within a job's life
NEVER_S = 3600.0
WAYS = {"Ray's stream end (no state reads)": NEVER_S, "follower, state every 1 s (the default)": 1.0,
        "follower, state every 0.3 s": 0.3}


def follow(hook, entrypoint: str, status_poll_s: float) -> tuple[float, float]:
    """Submit one job, follow it to its end; (seconds from its end to the follower's, from submit to it)."""
    submission_id = f"bench-follow-{uuid.uuid4().hex[:12]}"
    submitted = time.time()
    hook.submit_job(entrypoint=entrypoint, submission_id=submission_id)
    lines = list(hook.tail_job_logs(submission_id, status_poll_s=status_poll_s))
    done = time.time()
    info = hook.get_job_info(submission_id)
    if info["status"] != "SUCCEEDED" or not any("done" in line for line in lines):
        raise SystemExit(f"job {submission_id} ended {info['status']}: {''.join(lines)[-2000:]}")
    return done - info["end_time"] / 1000, done - submitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6, help="jobs followed each way")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="how long each job runs")
    args = parser.parse_args()
    interrupt_on_termination()
    entrypoint = (f"python -c \"import time; print('started', flush=True); time.sleep({args.job_seconds}); "
                  "print('done')\"")
    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="rb", dir="/tmp"), num_cpus=2, num_gpus=0,
                              token=new_token())
    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    try:
        cluster.start()
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
            {"conn_type": "ray_ml", "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token}})
        from airflow_ray_ml.hooks.ray import RayHook

        hook = RayHook(CONN_ID)
        follow(hook, entrypoint, 1.0)  # warm-up: the first job starts the cluster's job machinery
        for _ in range(args.jobs):
            for way, status_poll_s in WAYS.items():  # interleaved: the same load for each way
                results[way].append(follow(hook, entrypoint, status_poll_s))
    finally:
        cluster.stop()
    print(f"\n{args.jobs} jobs each way, each running {args.job_seconds:g} s; 2-CPU local cluster; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| how the task follows its job | after the job's end, median s | submit to done, median s | "
          "submit to done, ratio to Ray's stream end |")
    print("|---|---|---|---|")
    base = statistics.median(total for _, total in results[next(iter(WAYS))])
    for way, rows in results.items():
        after = statistics.median(lag for lag, _ in rows)
        total = statistics.median(total for _, total in rows)
        print(f"| {way} | {after:.2f} | {total:.2f} | {total / base:.2f} |")


if __name__ == "__main__":
    main()
