"""Benchmark the data stage as RayDataPreprocessOperator runs it vs pandas on one core, at three sizes.

    python bench/bench_preprocess.py                 # 6.5 k, 650 k and 6.5 M rows
    python bench/bench_preprocess.py --rows 6500 650000 [--repeats 3] [--no-ray-data]

For each size the generated wine data is written first (comma CSV shards of at most 650 k rows,
outside the timing). Then, one after the other on the same files:

* ``pandas``: a fresh process pinned to one core doing the same work: sha256 fingerprint of the
  inputs, read, validation, hash split, fit on train, transform, Parquet per split, preprocessor and
  profile JSON, through the same per-batch functions, on the whole table. Timed from spawn to
  exit (interpreter start and imports included).
* ``stage``: ``python -m airflow_ray_ml_stages.data --spec ...`` submitted through the Ray Jobs API to a local
  2-CPU cluster that this script starts (and stops), with the operator's runtime_env, timed from
  submit to the manifest appearing (what the operator waits for). ``engine`` is left at ``auto``
  (the direct pyarrow engine on this single node); ``stage, Ray Data`` forces ``engine=ray_data``.

The stage's fixed cost is measured apart, so the reader sees where the time goes: job submit to
RUNNING for a trivial entrypoint (``python -c pass``), the driver's imports (``python -c "import
airflow_ray_ml_stages.data.stage"`` in a fresh process) and the whole stage on 100 rows.

Peak memory is measured the same way for every engine: the largest sum of PSS (proportional set
size, so shared pages are not counted twice) sampled every 0.2 s over the engine's processes
(pandas: its process; the stage: every process of the Ray cluster's session, which includes the
job's driver and any worker it starts), minus that sum just before the engine starts.
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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARD_ROWS = 650_000
DEFAULT_ROWS = (6_500, 650_000, 6_500_000)
FIXED_ROWS = 100
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def write_inputs(rows: int, folder: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from airflow_ray_ml_stages import wine

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, start in enumerate(range(0, rows, SHARD_ROWS)):
        count = min(SHARD_ROWS, rows - start)
        path = folder / f"wine-{index:03d}.csv"
        pacsv.write_csv(pa.Table.from_pandas(wine.generate(count, seed=index), preserve_index=False), path)
        paths.append(str(path))
    return paths


def _pss(pids: list[int]) -> int:
    """Sum of the processes' PSS in bytes, from /proc/<pid>/smaps_rollup (cheap to read)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


class PeakSampler:
    """Largest sum of PSS over ``pids()`` sampled every 0.2 s, minus its value at the start.

    It runs in this (parent) process, not in the measured one, and measures both engines the same way.
    """

    def __init__(self, pids) -> None:
        self.pids = pids
        self.idle = _pss(pids())
        self.peak = self.idle
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _pss(self.pids()))
            self.stop.wait(0.2)

    def close(self) -> float:
        self.peak = max(self.peak, _pss(self.pids()))
        self.stop.set()
        self.thread.join()
        return (self.peak - self.idle) / 2**20


def _mark(what: str) -> None:
    print(what, flush=True)


def run_pandas(paths: list[str], out: str) -> dict:
    import hashlib

    import pandas as pd

    from airflow_ray_ml_stages import artifacts
    from airflow_ray_ml_stages.data.batch import BatchContext
    from airflow_ray_ml_stages.data.profile import build_profile, merge_summaries, summarise
    from airflow_ray_ml_stages.data.transform import transform
    from airflow_ray_ml_stages.data.validation import raise_findings
    from airflow_ray_ml_stages.preprocessor import Moments, Preprocessor
    from airflow_ray_ml_stages.specs import PreprocessSpec
    from airflow_ray_ml_stages.wine import FEATURES, LABEL, TYPE_COLUMN

    spec = PreprocessSpec(artifact_dir=out, source=paths, label_column=LABEL, label_range=[0, 10])
    _mark("STARTED")
    started = time.perf_counter()
    digest = hashlib.sha256()  # the input fingerprint, as the stage computes it
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(8 * 2**20):
                digest.update(chunk)
    frame = pd.concat([pd.read_csv(path) for path in paths], ignore_index=True)
    frame[TYPE_COLUMN] = frame[TYPE_COLUMN].astype(object)
    uris = [""] * len(frame)
    ctx = BatchContext(list(FEATURES), [TYPE_COLUMN], LABEL, spec.split, spec.seed, spec.nan_policy,
                       spec.label_range, {}, {})
    total = merge_summaries([summarise(frame, uris, ctx, {})], len(FEATURES) + 1)
    raise_findings(total, ctx)
    train = total["splits"]["train"]
    width = len(FEATURES)
    moments = Moments(train["moments"].count, *(getattr(train["moments"], k)[:width]
                                                for k in ("mean", "m2", "minimum", "maximum")))
    preprocessor = Preprocessor.fit(spec.scaler, list(FEATURES), moments,
                                    {TYPE_COLUMN: sorted(train["categories"][TYPE_COLUMN])}, LABEL)
    written = transform(frame, uris, ctx, preprocessor, total["label_integral"])
    for name, part in written.groupby("split"):
        folder = Path(out) / "splits" / f"split={name}"
        folder.mkdir(parents=True, exist_ok=True)
        part.drop(columns="split").to_parquet(folder / "part-0.parquet", index=False)
    artifacts.write_bytes_atomic(f"{out}/preprocessor.json", preprocessor.to_json().encode())
    profile = build_profile(total, ctx.plan, spec, [], "sha256:" + digest.hexdigest())
    artifacts.write_json_atomic(f"{out}/profile.json", profile)
    seconds = time.perf_counter() - started
    _mark("STOPPED")
    return {"seconds": seconds,
            "rows": {name: total["splits"][name]["rows"] for name in ("train", "validation", "test")}}


def child(argv: list[str]) -> None:
    paths_file, out = argv[:2]
    result = run_pandas(json.loads(Path(paths_file).read_text()), out)
    print("RESULT " + json.dumps(result), flush=True)


def measure_pandas(paths_file: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--child", str(paths_file), str(out)]
    command = ["taskset", "-c", "0", *command] if shutil.which("taskset") else command
    with tempfile.TemporaryFile("w+") as errors:
        spawned = time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
        sampler, peak_mb, result, lines = None, None, None, []
        for line in child.stdout:
            lines.append(line)
            if line.startswith("STARTED"):
                sampler = PeakSampler(lambda: [child.pid])
            elif line.startswith("STOPPED") and sampler is not None:
                peak_mb = sampler.close()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        child.wait()
        seconds = time.perf_counter() - spawned
        if result is None or peak_mb is None:
            errors.seek(0)
            raise RuntimeError(f"pandas run failed:\n{''.join(lines)[-2000:]}\n{errors.read()[-4000:]}")
    return {"seconds": seconds, "work_seconds": result["seconds"], "rows": result["rows"], "peak_mb": peak_mb}


def submit(client, entrypoint: str) -> str:
    import airflow_ray_ml_stages
    from airflow_ray_ml_stages.constants import JOB_ENV_VARS

    # What RayJobOperator.job_runtime_env() sends by default.
    return client.submit_job(entrypoint=entrypoint, runtime_env={
        "py_modules": [os.path.dirname(airflow_ray_ml_stages.__file__)], "env_vars": dict(JOB_ENV_VARS)})


STATUS_POLL_S = 0.5  # Jobs API polls load the head's dashboard, which shares the CPUs with the job
FILE_POLL_S = 0.01


def wait_job(client, job: str) -> str:
    while (status := str(client.get_job_status(job))) not in TERMINAL:
        time.sleep(STATUS_POLL_S)
    return status


def measure_stage(client, cluster, paths: list[str], out: Path, **fields) -> dict:
    from scripts.localcluster import session_pids
    from airflow_ray_ml_stages.wine import LABEL

    spec = {"artifact_dir": str(out), "source": paths, "label_column": LABEL, "label_range": [0, 10], **fields}
    manifest = out / "manifest.json"
    sampler = PeakSampler(lambda: session_pids(cluster.leader_pids[0]))
    started = time.perf_counter()
    job = submit(client, f"python -m airflow_ray_ml_stages.data --spec {shlex.quote(json.dumps(spec))}")
    asked = time.perf_counter()
    while not manifest.exists():
        if time.perf_counter() - asked > STATUS_POLL_S:  # the manifest file is polled often, the API rarely
            asked = time.perf_counter()
            if str(client.get_job_status(job)) in TERMINAL and not manifest.exists():
                break
        time.sleep(FILE_POLL_S)
    seconds = time.perf_counter() - started
    peak_mb = sampler.close()
    status = wait_job(client, job)
    if status != "SUCCEEDED":
        raise RuntimeError(f"stage job {job} ended {status}:\n{client.get_job_logs(job)[-4000:]}")
    result = json.loads(manifest.read_text())
    profile = json.loads(Path(result["profile_uri"]).read_text())
    return {"seconds": seconds, "rows": result["rows"], "peak_mb": peak_mb, "engine": profile["engine"]["name"],
            "stage_seconds": result["duration_s"]}


def fixed_costs(client, cluster, work: Path) -> dict:
    """Where a small stage's time goes: job start, the driver's imports, the whole stage on 100 rows."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}
    to_running = []
    for _ in range(3):
        started = time.perf_counter()
        job = submit(client, "python -c pass")
        while str(client.get_job_status(job)) == "PENDING":
            time.sleep(0.05)
        to_running.append(time.perf_counter() - started)
        wait_job(client, job)
    imports = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import airflow_ray_ml_stages.data.stage"], env=env, check=True)
        imports.append(time.perf_counter() - started)
    small = write_inputs(FIXED_ROWS, work / "in-fixed")
    stage = [measure_stage(client, cluster, small, work / f"out-fixed-{index}")["seconds"] for index in range(3)]
    return {"to_running": statistics.median(to_running), "imports": statistics.median(imports),
            "stage": statistics.median(stage)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    from scripts.localcluster import interrupt_on_termination

    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS))
    parser.add_argument("--repeats", type=int, default=1, help="runs of each engine per size (the median is shown)")
    parser.add_argument("--no-ray-data", action="store_true", help="skip the engine=ray_data runs")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "include")]
    from ray.job_submission import JobSubmissionClient

    from scripts.localcluster import LocalRayCluster, new_token

    work = Path(tempfile.mkdtemp(prefix="bench-pre-", dir="/tmp"))
    cluster = LocalRayCluster(temp_dir=str(work / "ray"), num_cpus=2, num_gpus=0, token=new_token())
    engines = ["pandas", "stage"] + ([] if args.no_ray_data else ["stage, Ray Data"])
    table = []
    load = [os.getloadavg()[0]]
    try:
        cluster.start()
        client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
        # Warm-up: the package upload (once per package version) and, for Ray Data, its detached
        # actors (once per cluster) are not what a task run on a long-lived cluster pays.
        warm = write_inputs(FIXED_ROWS, work / "in-warm")
        measure_stage(client, cluster, warm, work / "out-warm")
        if not args.no_ray_data:
            measure_stage(client, cluster, warm, work / "out-warm-rd", engine="ray_data")
        fixed = fixed_costs(client, cluster, work)
        print(f"fixed: {json.dumps(fixed)}", file=sys.stderr, flush=True)
        for rows in args.rows:
            paths = write_inputs(rows, work / f"in-{rows}")
            paths_file = work / f"in-{rows}.json"
            paths_file.write_text(json.dumps(paths))
            runs: dict[str, list[dict]] = {engine: [] for engine in engines}
            for repeat in range(args.repeats):
                for engine in engines:
                    out = work / f"out-{rows}-{len(runs[engine])}-{engine.replace(' ', '').replace(',', '')}"
                    if engine == "pandas":
                        runs[engine].append(measure_pandas(paths_file, out))
                    else:
                        fields = {"engine": "ray_data"} if engine != "stage" else {}
                        runs[engine].append(measure_stage(client, cluster, paths, out, **fields))
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"{rows} rows {engine}: {json.dumps(runs[engine][-1])}", file=sys.stderr, flush=True)
            for engine in engines[1:]:
                assert all(run["rows"] == runs["pandas"][0]["rows"] for run in runs[engine]), runs
            table.append((rows, {engine: {"seconds": statistics.median(r["seconds"] for r in found),
                                          "best": min(r["seconds"] for r in found),
                                          "peak_mb": max(r["peak_mb"] for r in found),
                                          "engine": found[0].get("engine", "pandas")}
                                 for engine, found in runs.items()}))
            shutil.rmtree(work / f"in-{rows}", ignore_errors=True)
            load.append(os.getloadavg()[0])
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    header = (f"{'rows':>10} | {'engine':<16} | {'seconds':>7} | {'rows/s':>11} | {'vs pandas speed':>15} | "
              f"{'peak MB':>8} | {'vs pandas mem':>13}")
    print(header)
    print("-" * len(header))
    for rows, results in table:
        pandas = results["pandas"]
        for engine in engines:
            found = results[engine]
            name = engine if engine == "pandas" else f"{engine} ({found['engine']})" if engine == "stage" else engine
            print(f"{rows:>10,} | {name:<16} | {found['seconds']:>7.2f} | {rows / found['seconds']:>11,.0f} | "
                  f"{pandas['seconds'] / found['seconds']:>14.2f}x | {found['peak_mb']:>8,.0f} | "
                  f"{found['peak_mb'] / pandas['peak_mb']:>12.2f}x")
    print(f"stage fixed cost (medians of 3): job submit -> RUNNING {fixed['to_running']:.2f} s; driver imports "
          f"(python -c 'import airflow_ray_ml_stages.data.stage') {fixed['imports']:.2f} s; the whole stage on {FIXED_ROWS} rows, submit -> "
          f"manifest {fixed['stage']:.2f} s")
    print(f"seconds: median of {args.repeats} run(s); pandas from spawn to exit on one core, the stage from job submit "
          f"to manifest; load average (1 min) during the run: {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
