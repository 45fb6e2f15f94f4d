"""Benchmark: the train stage as RayTrainOperator runs it vs plain Lightning and plain XGBoost.

Same splits, same epochs/rounds (early stopping off), same seed. Each contender starts cold:
- plain: ``bench/plain_train.py`` in a fresh process, timed from spawn to exit (imports included);
- stage: ``python -m airflow_ray_ml_stages.train`` submitted as a Ray job to a local 2-CPU cluster with the
  operator's runtime_env (``py_modules`` + ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``), timed from
  submit to the manifest appearing (what the operator waits for), and to the job's end.
One warm-up job runs first so the package upload (once per package version) is not counted.
The job's fixed cost is measured apart: submit -> RUNNING of a trivial entrypoint (``python -c
pass``) and the stage's driver imports in a fresh process. With ``--repeats N`` every row is run N
times, interleaved, and the table shows the median and the best; the load average is printed too,
since other processes on a shared machine slow the 2-CPU cluster far more than a one-core script.

Usage::

    python bench/bench_train.py [--repeats 1] [--epochs 15] [--rounds 100] [--skip-large] [--skip-small]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

import airflow_ray_ml_stages  # noqa: E402
from airflow_ray_ml_stages.constants import JOB_ENV_VARS  # noqa: E402
from airflow_ray_ml_stages.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402
from tests.train_data import write_splits  # noqa: E402

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def plain(family: str, fields: dict, iterations: int, batch_size: int | None = None) -> tuple[float, float]:
    splits = {name: fields[f"{name}_uri"] for name in ("train", "validation", "test")}
    started = time.monotonic()
    output = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plain_train.py"), "--family", family, "--splits", json.dumps(splits),
         "--features", json.dumps(fields["feature_columns"]), "--iterations", str(iterations),
         *(["--batch-size", str(batch_size)] if batch_size else [])],
        capture_output=True, text=True, check=True,
    ).stdout
    return time.monotonic() - started, json.loads(output.strip().splitlines()[-1])["test_rmse"]


def stage(client, work: Path, fields: dict, config: dict, **spec_fields) -> tuple[float, float, float, dict]:
    artifact_dir = work / f"run-{time.monotonic_ns()}"
    spec = {**fields, "artifact_dir": str(artifact_dir), "config": config, **spec_fields}
    manifest = artifact_dir / "manifest.json"
    started = time.monotonic()
    job = client.submit_job(
        entrypoint=f"python -m airflow_ray_ml_stages.train --spec {shlex.quote(json.dumps(spec))}",
        runtime_env={"py_modules": [str(Path(airflow_ray_ml_stages.__file__).parent)], "env_vars": dict(JOB_ENV_VARS)},
    )
    # The manifest file is polled often, the Jobs API every 0.5 s (as the operator does, about):
    # each API call costs the head's dashboard CPU that the job shares.
    to_manifest, asked, status = None, 0.0, None
    while True:
        if to_manifest is None and manifest.exists():
            to_manifest = time.monotonic() - started
        if time.monotonic() - asked > 0.5:
            asked = time.monotonic()
            status = client.get_job_status(job)
            if status in TERMINAL:
                break
        time.sleep(0.01)
    to_end = time.monotonic() - started
    if status != "SUCCEEDED":
        raise SystemExit(f"job {job} ended {status}:\n{client.get_job_logs(job)[-3000:]}")
    result = json.loads(manifest.read_text())
    return to_manifest or to_end, to_end, result["metrics"]["test"]["rmse"], result


class _Rows(list):
    """The table's rows, each also printed as it comes (a long run shows progress)."""

    def append(self, row) -> None:
        super().append(row)
        print("row:", row, flush=True)


def fixed_costs(client) -> dict[str, float]:
    """Medians of 3: job submit -> RUNNING for ``python -c pass``, and the stage driver's imports."""
    to_running = []
    for _ in range(3):
        started = time.monotonic()
        job = client.submit_job(entrypoint="python -c pass", runtime_env={
            "py_modules": [str(Path(airflow_ray_ml_stages.__file__).parent)], "env_vars": dict(JOB_ENV_VARS)})
        while str(client.get_job_status(job)) == "PENDING":
            time.sleep(0.05)
        to_running.append(time.monotonic() - started)
        while str(client.get_job_status(job)) not in TERMINAL:
            time.sleep(0.05)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
    imports = {}
    for name, code in (("train_xgboost", "import airflow_ray_ml_stages.train.stage, xgboost, pyarrow.parquet"),
                       ("ray_train", "import ray; import ray.train.xgboost")):
        seconds = []
        for _ in range(3):
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            seconds.append(time.monotonic() - started)
        imports[name] = statistics.median(seconds)
    return {"to_running": statistics.median(to_running), **imports}


def main() -> None:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--large-epochs", type=int, default=2)
    parser.add_argument("--large-rounds", type=int, default=30)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-small", action="store_true")
    parser.add_argument("--auto-only", action="store_true", help="wine scale: only the stage as the operator runs it")
    args = parser.parse_args()

    from ray.job_submission import JobSubmissionClient

    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    small = write_splits(work / "wine", rows=6497)
    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bt", dir="/tmp"), num_cpus=2, num_gpus=0, token=new_token())
    cluster.start()
    rows: list[tuple[str, float, float, float | None, str]] = _Rows()
    load = [os.getloadavg()[0]]
    fixed = None
    try:
        client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
        xgb_small = {"family": "xgboost", "num_boost_round": args.rounds, "early_stopping_rounds": 0}
        stage(client, work, small, {**xgb_small, "num_boost_round": 2}, num_workers=0)  # warm-up: package upload
        fixed = fixed_costs(client)
        print("fixed:", fixed, flush=True)

        families = {
            "lightning": ({"family": "lightning", "max_epochs": args.epochs, "patience": 0}, args.epochs),
            "xgboost": (xgb_small, args.rounds),
        }
        for family, (config, iterations) in ({} if args.skip_small else families).items():
            unit = "epochs" if family == "lightning" else "rounds"
            variants = [("stage auto (local mode, direct read)", {})]
            if not args.auto_only:
                variants += [("stage 1 worker, direct read", {"num_workers": 1, "data_loading": "direct"}),
                             ("stage 1 worker, Ray Data (naive)", {"num_workers": 1, "data_loading": "ray_data"})]
            runs: dict[str, list] = {}
            for _ in range(args.repeats):
                plain_s, plain_rmse = plain(family, small, iterations)
                runs.setdefault(f"{family} plain script ({iterations} {unit})", []).append((plain_s, plain_s, plain_rmse, ""))
                for label, extra in variants:
                    manifest_s, end_s, rmse, result = stage(client, work, small, config, **extra)
                    runs.setdefault(f"{family} {label}", []).append(
                        (manifest_s, end_s, rmse, result["training"].get("runner", "ray_train")))
                load.append(os.getloadavg()[0])
            base = None
            for label, found in runs.items():
                manifest_s = statistics.median(run[0] for run in found)
                best = min(run[0] for run in found)
                base = base or (manifest_s, best)
                runner = f", runner {found[0][3]}" if found[0][3] else ""
                ratio = None if label.startswith(f"{family} plain") else manifest_s / base[0]
                rows.append((label, manifest_s, statistics.median(run[1] for run in found), ratio,
                             f"rmse {found[0][2]:.4f}; best {best:.1f} s ({best / base[1]:.2f}x best plain){runner}"))

        if not args.skip_large:
            large = write_splits(work / "wine100", rows=649_700)
            compute = {"use_gpu": False, "gpus_per_worker": 0, "num_workers": 2, "cpus_per_worker": 0.5,
                       "accelerator": "cpu", "reason": "bench: 2 workers x 0.5 CPU, 1 CPU left for Ray Data"}
            large_families = {
                "lightning": {"family": "lightning", "max_epochs": args.large_epochs, "patience": 0, "batch_size": 1024},
                "xgboost": {"family": "xgboost", "num_boost_round": args.large_rounds, "early_stopping_rounds": 0},
            }
            # What the probe plans on one 2-CPU node: one CPU worker (so auto trains in the job's process).
            one_node = {"use_gpu": False, "gpus_per_worker": 0, "num_workers": 1, "cpus_per_worker": 1.0,
                        "accelerator": "cpu", "reason": "bench: the probe's plan on one 2-CPU node"}
            for family, config in large_families.items():
                iterations = config.get("max_epochs") or config["num_boost_round"]
                plain_s, plain_rmse = plain(family, large, iterations, config.get("batch_size"))
                one_s = None
                for workers in (1, 2):
                    manifest_s, end_s, rmse, _ = stage(client, work, large, config, compute=compute,
                                                       num_workers=workers, data_loading="ray_data")
                    one_s = one_s or manifest_s
                    rows.append((f"{family} x100 stage {workers} worker(s) x 0.5 CPU, Ray Data", manifest_s, end_s,
                                 manifest_s / one_s, f"rmse {rmse:.4f}"))
                manifest_s, end_s, rmse, result = stage(client, work, large, config, compute=one_node)
                rows.append((f"{family} x100 stage auto (probe plan: 1 CPU worker)", manifest_s, end_s,
                             manifest_s / one_s, f"rmse {rmse:.4f}; runner {result['training'].get('runner')}; "
                             f"{manifest_s / plain_s:.2f}x plain"))
                rows.append((f"{family} x100 plain script", plain_s, plain_s, plain_s / one_s, f"rmse {plain_rmse:.4f}"))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'run':58} {'to manifest s':>13} {'to job end s':>12} {'ratio':>7}  note")
    for name, manifest_s, end_s, ratio, note in rows:
        ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
        print(f"{name:58} {manifest_s:13.1f} {end_s:12.1f} {ratio_text:>7}  {note}")
    print("\nratio: wine scale vs the plain script of the same family; x100: vs the 1-worker Ray Data stage. Wine scale: "
          f"median of {args.repeats} run(s), interleaved.")
    if fixed:
        print(f"job fixed cost (medians of 3): submit -> RUNNING {fixed['to_running']:.2f} s (python -c pass); driver "
              f"imports: airflow_ray_ml_stages.train + xgboost + pyarrow.parquet {fixed['train_xgboost']:.2f} s, ray.train.xgboost "
              f"{fixed['ray_train']:.2f} s (not imported by the in-process XGBoost run)")
    load.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: {min(load):.1f}-{max(load):.1f}")
    print(f"machine: {os.cpu_count()} CPUs, shared; cluster: 2 CPUs; data: wine 6,497 rows and 649,700 rows.")


if __name__ == "__main__":
    main()
