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
                                [--large-families lightning xgboost] [--large-epochs 2] [--large-rounds 30]

At 100x the wine data (``--skip-small`` runs only that part) the table compares, side by side and
interleaved: the plain script (with Lightning also with the stage's whole-batch loader, so the Ray
overhead shows apart from the loader's gain, and that script as Lightning's own two-process DDP
without Ray, so two workers' cost shows apart from this machine's all-reduce), the stage as auto runs it on one 2-CPU node (in the
job's process), and the stage on one and on two Ray Train workers of 0.5 CPU fed by Ray Data. The
per-worker rows/s are each worker's training rows times the epochs (rounds) over the training
call's own time (``trainer.fit`` / ``xgboost.train``, the manifest's ``training.loop_timings.fit_s``).
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
from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402
from tests.child import read_result, result_file  # noqa: E402
from tests.train_data import write_splits  # noqa: E402

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def plain(family: str, fields: dict, iterations: int, batch_size: int | None = None,
          whole_batches: bool = False, details: dict | None = None, processes: int = 1) -> tuple[float, float]:
    """The plain script's seconds (spawn to exit) and test RMSE; ``details`` gets its JSON line."""
    splits = {name: fields[f"{name}_uri"] for name in ("train", "validation", "test")}
    result_path = result_file()
    started = time.monotonic()
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plain_train.py"), "--family", family, "--splits", json.dumps(splits),
         "--features", json.dumps(fields["feature_columns"]), "--iterations", str(iterations),
         *(["--batch-size", str(batch_size)] if batch_size else []), *(["--whole-batches"] if whole_batches else []),
         "--processes", str(processes), "--result", result_path],
        capture_output=True, text=True, check=True,
    )
    result = read_result(result_path)
    if details is not None:
        details.update(result)
    return time.monotonic() - started, result["test_rmse"]


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


# 100x the wine data: the Ray Train + Ray Data path against the plain script, side by side.
LARGE_CPU = {"use_gpu": False, "gpus_per_worker": 0, "num_workers": 2, "cpus_per_worker": 0.5,
             "accelerator": "cpu", "reason": "bench: workers x 0.5 CPU, the rest left for Ray Data"}
# What the probe plans on one 2-CPU node: one CPU worker (so auto trains in the job's process).
ONE_NODE = {"use_gpu": False, "gpus_per_worker": 0, "num_workers": 1, "cpus_per_worker": 1.0,
            "accelerator": "cpu", "reason": "bench: the probe's plan on one 2-CPU node"}


PLAIN_LOADER = "plain script, the stage's whole-batch loader"
PLAIN_DDP = "plain script, Lightning DDP, 2 processes x 1 thread, the stage's loader (no Ray)"


def large_bench(client, work: Path, args, load: list[float]) -> dict[str, dict[str, list[dict]]]:
    """Every contender at 100x the wine data, ``--repeats`` times, interleaved: {family: {row: [run, ...]}}."""
    large = write_splits(work / "wine100", rows=649_700)
    configs = {
        "lightning": {"family": "lightning", "max_epochs": args.large_epochs, "patience": 0, "batch_size": 1024},
        "xgboost": {"family": "xgboost", "num_boost_round": args.large_rounds, "early_stopping_rounds": 0},
    }
    families = [family for family in configs if family in args.large_families]
    runs: dict[str, dict[str, list[dict]]] = {family: {} for family in families}
    for _ in range(args.repeats):
        for family in families:
            config = configs[family]
            iterations = config.get("max_epochs") or config["num_boost_round"]
            contenders = [("plain script", "plain", {})]
            if family == "lightning":
                contenders.append((PLAIN_LOADER, "plain", {"whole_batches": True}))
                # what two workers cost without Ray: Lightning's own DDP on the same two CPUs
                contenders.append((PLAIN_DDP, "plain", {"whole_batches": True, "processes": 2}))
            contenders += [
                ("stage, auto (in the job's process)", "stage", {"compute": ONE_NODE}),
                ("stage, 1 Ray Train worker x 0.5 CPU, Ray Data", "stage",
                 {"compute": LARGE_CPU, "num_workers": 1, "data_loading": "ray_data"}),
                ("stage, 2 Ray Train workers x 0.5 CPU, Ray Data", "stage",
                 {"compute": LARGE_CPU, "num_workers": 2, "data_loading": "ray_data"}),
            ]
            for label, kind, extra in contenders:
                if kind == "plain":
                    details: dict = {}
                    seconds, rmse = plain(family, large, iterations, config.get("batch_size"), details=details, **extra)
                    run = {"seconds": seconds, "rmse": rmse, "fit_s": details.get("fit_s"),
                           "rows_per_worker": details.get("train_rows_per_process", details.get("train_rows")),
                           "workers": extra.get("processes", 1)}
                else:
                    seconds, _, rmse, result = stage(client, work, large, config, **extra)
                    training = result["training"]
                    run = {"seconds": seconds, "rmse": rmse, "fit_s": training["loop_timings"]["fit_s"],
                           "read_s": training["loop_timings"]["read_s"], "runner": training["runner"],
                           "rows_per_worker": training["train_rows_per_worker"], "workers": training["world_size"]}
                run["iterations"] = iterations
                runs[family].setdefault(label, []).append(run)
                print("large:", family, label, run, flush=True)
                load.append(os.getloadavg()[0])
    return runs


def print_large(runs: dict[str, dict[str, list[dict]]], args) -> None:
    """The x100 tables: seconds to the manifest (medians), vs the plain script, and per-worker rows/s."""
    for family, found in runs.items():
        unit = f"{args.large_epochs} epochs" if family == "lightning" else f"{args.large_rounds} rounds"
        print(f"\n{family}, 100x the wine data (454,790 training rows), {unit}, medians of {args.repeats}:\n")
        print("| contender | seconds | ÷ plain | training s | per-worker rows/s | ÷ 1 worker's | test rmse |")
        print("|---|---|---|---|---|---|---|")
        plain_s = statistics.median(run["seconds"] for run in found["plain script"])
        one_worker = one_process = None
        for label, label_runs in found.items():
            seconds = statistics.median(run["seconds"] for run in label_runs)
            fit_s = statistics.median(run["fit_s"] for run in label_runs)
            # Rows each worker trained on per second of training (trainer.fit / xgboost.train): the epochs
            # or rounds times its rows, over the training call's time.
            rate = statistics.median(run["rows_per_worker"] * run["iterations"] / run["fit_s"] for run in label_runs)
            if "1 Ray Train worker" in label:
                one_worker = rate
            if label == PLAIN_LOADER:
                one_process = rate
            # Ray Train rows against one Ray Train worker; plain DDP against the same loader in one process
            base = one_worker if "Ray Train worker" in label else one_process if label == PLAIN_DDP else None
            versus = f"{rate / base:.2f}x" if base else "-"
            print(f"| {label} | {seconds:.1f} | {seconds / plain_s:.2f} | {fit_s:.1f} | {rate:,.0f} | {versus} | "
                  f"{statistics.median(run['rmse'] for run in label_runs):.4f} |")
        reads = [run["read_s"] for label, label_runs in found.items() if "Ray Data" in label for run in label_runs]
        if reads:
            print(f"\nRay Train workers' read of the splits (Ray Data shard, imports overlapped): median "
                  f"{statistics.median(reads):.1f} s")


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
    parser.add_argument("--large-families", nargs="+", default=["lightning", "xgboost"],
                        choices=["lightning", "xgboost"], help="x100: which families to run")
    parser.add_argument("--auto-only", action="store_true", help="wine scale: only the stage as the operator runs it")
    args = parser.parse_args()

    from ray.job_submission import JobSubmissionClient

    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    small = write_splits(work / "wine", rows=6497)
    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bt", dir="/tmp"), num_cpus=2, num_gpus=0, token=new_token())
    cluster.start()
    rows: list[tuple[str, float, float, float | None, str]] = _Rows()
    large_runs: dict[str, dict[str, list[dict]]] = {}
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
            large_runs = large_bench(client, work, args, load)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    if rows:
        print()
        print(f"{'run':58} {'to manifest s':>13} {'to job end s':>12} {'ratio':>7}  note")
        for name, manifest_s, end_s, ratio, note in rows:
            ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
            print(f"{name:58} {manifest_s:13.1f} {end_s:12.1f} {ratio_text:>7}  {note}")
        print("\nratio: vs the plain script of the same family. Wine scale: "
              f"median of {args.repeats} run(s), interleaved.")
    if fixed:
        print(f"job fixed cost (medians of 3): submit -> RUNNING {fixed['to_running']:.2f} s (python -c pass); driver "
              f"imports: airflow_ray_ml_stages.train + xgboost + pyarrow.parquet {fixed['train_xgboost']:.2f} s, ray.train.xgboost "
              f"{fixed['ray_train']:.2f} s (not imported by the in-process XGBoost run)")
    if large_runs:
        print_large(large_runs, args)
    load.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: {min(load):.1f}-{max(load):.1f}")
    print(f"machine: {os.cpu_count()} CPUs, shared; cluster: 2 CPUs; data: wine 6,497 rows and 649,700 rows.")


if __name__ == "__main__":
    main()
