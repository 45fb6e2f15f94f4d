"""Benchmark: the tune stage with ASHA early stopping vs the same trials run to their end.

Same data (the generated wine set, 6,497 rows, preprocessed as the data stage writes it), same
search space (the default: both families, both scalers), same searcher seed, so both runs sample
the same configs; only the scheduler differs. Each run is ``python -m airflow_ray_ml_stages.tune`` submitted as a
Ray job to one local 2-CPU cluster (one CPU per trial, two at once), timed from submit to the
manifest. One warm-up job runs first so the package upload is not counted.

Usage::

    python bench/bench_tune.py [--samples 16] [--searcher random|adaptive|optuna]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

import airflow_ray_ml_stages  # noqa: E402
from airflow_ray_ml_stages.constants import JOB_ENV_VARS  # noqa: E402
from airflow_ray_ml_stages.specs import SEARCHERS  # noqa: E402
from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402
from tests.train_data import write_preprocessed  # noqa: E402

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def tune(client, work: Path, data: dict, **spec_fields) -> tuple[float, dict]:
    artifact_dir = work / f"run-{time.monotonic_ns()}"
    spec = {"artifact_dir": str(artifact_dir), "train_uri": data["split_uris"]["train"],
            "validation_uri": data["split_uris"]["validation"], "feature_columns": data["feature_columns"],
            "label_column": data["label_column"],
            "preprocessor_uri": data["preprocessor_uri"], "preprocessor_variants": data["preprocessor_variants"],
            **spec_fields}
    started = time.monotonic()
    job = client.submit_job(
        entrypoint=f"python -m airflow_ray_ml_stages.tune --spec {shlex.quote(json.dumps(spec))}",
        runtime_env={"py_modules": [str(Path(airflow_ray_ml_stages.__file__).parent)], "env_vars": dict(JOB_ENV_VARS)},
    )
    manifest = artifact_dir / "manifest.json"
    while not manifest.exists() and client.get_job_status(job) not in TERMINAL:
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    while client.get_job_status(job) not in TERMINAL:
        time.sleep(0.1)
    if client.get_job_status(job) != "SUCCEEDED":
        raise SystemExit(f"job {job} failed:\n{client.get_job_logs(job)[-3000:]}")
    return elapsed, json.loads(manifest.read_text())


def main() -> None:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16)
    # random by default: the adaptive searcher's trials depend on the results, which ASHA changes
    parser.add_argument("--searcher", default="random", choices=list(SEARCHERS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--new-actor-per-trial", action="store_true", help="reuse_actors=False")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of (none, asha), alternating the order")
    args = parser.parse_args()

    from ray.job_submission import JobSubmissionClient

    work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
    data = write_preprocessed(work / "wine", rows=6497, seed=7)
    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bu", dir="/tmp"), num_cpus=2, num_gpus=0, token=new_token())
    cluster.start()
    results = {}
    try:
        client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
        tune(client, work, data, num_samples=1, search_space={"family": "xgboost", "xgboost": {"num_boost_round": 5}})
        common = {"num_samples": args.samples, "searcher": args.searcher, "seed": args.seed, "cpus_per_trial": 1.0,
                  "max_concurrent_trials": 2, "reuse_actors": not args.new_actor_per_trial}
        for repeat in range(args.repeats):
            # Alternate the order: the machine is shared, and its load drifts during a run.
            for scheduler in (("none", "asha") if repeat % 2 == 0 else ("asha", "none")):
                seconds, manifest = tune(client, work, data, scheduler=scheduler, **common)
                rows = json.loads(Path(manifest["leaderboard_json_uri"]).read_text())
                trial_seconds = sum(row["time_s"] for row in rows)
                results.setdefault(scheduler, []).append((seconds, manifest, trial_seconds))
                print(f"row: {scheduler} {seconds:.1f} s, trial-seconds {trial_seconds:.1f}, best "
                      f"{manifest['best_metric']:.4f} {manifest['trials']}", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    base_s = sum(seconds for seconds, _, _ in results["none"])
    base_trial_s = sum(trial_s for _, _, trial_s in results["none"])
    base_best = results["none"][0][1]["best_metric"]
    print()
    print(f"{'scheduler':22} {'time s':>8} {'time ratio':>10} {'trial-s ratio':>13} {'best val_rmse':>13} "
          f"{'vs no stopping':>14} {'completed':>9} {'stopped':>7} {'best trial':>18}")
    for scheduler, label in (("none", "none (all trials run)"), ("asha", "ASHA")):
        runs = results[scheduler]
        seconds = sum(run[0] for run in runs)
        trial_s = sum(run[2] for run in runs)
        manifest = runs[0][1]
        change = 100 * (manifest["best_metric"] - base_best) / base_best
        best = manifest["best_config"]
        print(f"{label:22} {seconds / len(runs):8.1f} {seconds / base_s:9.2f}x {trial_s / base_trial_s:12.2f}x "
              f"{manifest['best_metric']:13.4f} {change:+13.2f}% {manifest['trials']['completed']:9d} "
              f"{manifest['trials']['early_stopped']:7d} {best['family'] + '/' + best.get('scaler', '-'):>18}")
    print(f"\n{args.samples} trials, {args.searcher} search (seed {args.seed}), default search space, 1 CPU per trial, "
          f"2 at once, reuse_actors={not args.new_actor_per_trial}, {args.repeats} run(s) each (time: mean); trial-s: the trials' "
          f"own time summed; machine: {os.cpu_count()} CPUs, shared; data: wine 6,497 rows (generated).")


if __name__ == "__main__":
    main()
