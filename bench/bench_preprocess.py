"""Benchmark the data stage: Ray Data vs pandas on one core, doing the same work, at three sizes.

    python bench/bench_preprocess.py                 # 6.5 k, 650 k and 6.5 M rows
    python bench/bench_preprocess.py --rows 6500 650000

For each size the generated wine data is written first (comma CSV shards of at most 650 k rows,
outside the timing). Then each engine runs in a fresh process, timed from the start of the stage's
work to its last output (the manifest's content):

* ``ray``: ``rayml.data.run_preprocess`` in a new driver (a new Ray job, as every Airflow task
  is) against a local 2-CPU Ray cluster that this script starts (and stops). The time excludes
  starting the driver and ``ray.init`` (and, for a real task, job submission: ~1.3 s, DESIGN.md)
  but includes starting the job's Ray workers. The stage then runs again in the same driver
  ("warm": workers already up), which is Ray Data's cost without that start-up. A first line
  measures the fixed cost: the stage on 100 rows, cold and warm.
* ``pandas``: the same work in one process pinned to one core: sha256 fingerprint of the inputs,
  read, validation, hash split, fit on train, transform, Parquet per split, preprocessor and
  profile JSON, through the same per-batch functions, on the whole table.

Peak memory is measured the same way for both: the largest sum of PSS (proportional set size, so
shared object-store pages are not counted twice) sampled every 0.2 s over the engine's processes
(pandas: its process; ray: the driver and every process of the Ray cluster, including the workers
the job starts), minus that sum when the stage starts (after imports and ``ray.init``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def write_inputs(rows: int, folder: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from rayml import wine

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


def run_ray(paths: list[str], out: str, leader: int) -> dict:
    import ray

    import rayml
    from rayml.data import run_preprocess
    from rayml.localcluster import session_pids
    from rayml.specs import PreprocessSpec

    ray.init(runtime_env={"py_modules": [os.path.dirname(rayml.__file__)]}, logging_level="WARNING",
             log_to_driver=False)
    _mark("STARTED")
    started = time.perf_counter()
    result = run_preprocess(PreprocessSpec(artifact_dir=out, source=paths, label_range=[0, 10]))
    seconds = time.perf_counter() - started
    _mark("STOPPED")
    # The same stage again in the same driver (same Ray job): its workers are already started.
    started = time.perf_counter()
    again = run_preprocess(PreprocessSpec(artifact_dir=out + "-warm", source=paths, label_range=[0, 10]))
    warm = time.perf_counter() - started
    assert again.rows == result.rows
    return {"seconds": seconds, "warm_seconds": warm, "rows": result.rows}


def run_pandas(paths: list[str], out: str) -> dict:
    import hashlib

    import pandas as pd

    from rayml import artifacts
    from rayml.data import BatchContext, build_profile, merge_summaries, raise_findings, summarise, transform
    from rayml.preprocessor import Moments, Preprocessor
    from rayml.specs import PreprocessSpec
    from rayml.wine import FEATURES, LABEL, TYPE_COLUMN

    spec = PreprocessSpec(artifact_dir=out, source=paths, label_range=[0, 10])
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
    engine, paths_file, out = argv[:3]
    paths = json.loads(Path(paths_file).read_text())
    result = run_ray(paths, out, int(argv[3])) if engine == "ray" else run_pandas(paths, out)
    print("RESULT " + json.dumps(result), flush=True)


def measure(engine: str, paths_file: Path, out: Path, cluster) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")]),
           "OMP_NUM_THREADS": "1" if engine == "pandas" else os.environ.get("OMP_NUM_THREADS", "")}
    command = [sys.executable, __file__, "--child", engine, str(paths_file), str(out)]
    if engine == "ray":
        env.update({"RAY_ADDRESS": cluster.address, "RAY_AUTH_TOKEN": cluster.token, "RAY_AUTH_MODE": "token"})
        command.append(str(cluster.leader_pids[0]))
    else:
        command = ["taskset", "-c", "0", *command] if shutil.which("taskset") else command
    from rayml.localcluster import session_pids

    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
        pids = (lambda: [child.pid, *session_pids(cluster.leader_pids[0])]) if engine == "ray" else (lambda: [child.pid])
        sampler, peak_mb, result, lines = None, None, None, []
        for line in child.stdout:
            lines.append(line)
            if line.startswith("STARTED"):
                sampler = PeakSampler(pids)
            elif line.startswith("STOPPED") and sampler is not None:
                peak_mb = sampler.close()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        child.wait()
        if result is None or peak_mb is None:
            errors.seek(0)
            raise RuntimeError(f"{engine} run failed:\n{''.join(lines)[-2000:]}\n{errors.read()[-4000:]}")
    return {**result, "peak_mb": peak_mb}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS))
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "include")]
    from rayml.localcluster import LocalRayCluster, new_token

    work = Path(tempfile.mkdtemp(prefix="bench-pre-", dir="/tmp"))
    cluster = LocalRayCluster(temp_dir=str(work / "ray"), num_cpus=2, token=new_token())
    rows_out = []
    try:
        cluster.start()
        # The fixed cost: the stage on FIXED_ROWS rows, where per-row work is negligible. The first
        # job on a new cluster also creates Ray Data's detached actors (once per cluster, ~10 s
        # here): that run is not reported, as a long-lived cluster has paid it already.
        paths_file = work / "in-fixed.json"
        paths_file.write_text(json.dumps(write_inputs(FIXED_ROWS, work / "in-fixed")))
        measure("ray", paths_file, work / "out-first", cluster)
        fixed = measure("ray", paths_file, work / "out-fixed", cluster)
        print(f"fixed: {json.dumps(fixed)}", file=sys.stderr, flush=True)
        for rows in args.rows:
            paths = write_inputs(rows, work / f"in-{rows}")
            paths_file = work / f"in-{rows}.json"
            paths_file.write_text(json.dumps(paths))
            results = {engine: measure(engine, paths_file, work / f"out-{engine}-{rows}", cluster)
                       for engine in ("pandas", "ray")}
            assert results["ray"]["rows"] == results["pandas"]["rows"], results
            rows_out.append((rows, results))
            shutil.rmtree(work / f"in-{rows}", ignore_errors=True)
            for engine in ("pandas", "ray"):
                for suffix in ("", "-warm"):
                    shutil.rmtree(work / f"out-{engine}-{rows}{suffix}", ignore_errors=True)
            print(f"done {rows} rows: {json.dumps(results)}", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    header = (f"{'rows':>10} | {'pandas rows/s':>13} | {'ray rows/s':>11} | {'ray/pandas speed':>16} | "
              f"{'ray warm rows/s':>15} | {'warm/pandas':>11} | "
              f"{'pandas peak MB':>14} | {'ray peak MB':>11} | {'ray/pandas mem':>14}")
    print(header)
    print("-" * len(header))
    for rows, results in rows_out:
        pandas, ray = results["pandas"], results["ray"]
        print(f"{rows:>10,} | {rows / pandas['seconds']:>13,.0f} | {rows / ray['seconds']:>11,.0f} | "
              f"{pandas['seconds'] / ray['seconds']:>15.2f}x | {rows / ray['warm_seconds']:>15,.0f} | "
              f"{pandas['seconds'] / ray['warm_seconds']:>10.2f}x | {pandas['peak_mb']:>14,.0f} | "
              f"{ray['peak_mb']:>11,.0f} | {ray['peak_mb'] / pandas['peak_mb']:>13.2f}x")
    print(f"ray fixed cost (the stage on {FIXED_ROWS} rows): {fixed['seconds']:.2f} s in a new driver (new Ray job: "
          f"workers start and import Ray Data), {fixed['warm_seconds']:.2f} s again in the same driver; job "
          "submission and ray.init are not included in any time above")
    for rows, results in rows_out:
        pandas, ray = results["pandas"], results["ray"]
        print(f"{rows:>10,} rows: pandas {pandas['seconds']:.2f} s, ray {ray['seconds']:.2f} s "
              f"(warm {ray['warm_seconds']:.2f} s)")


if __name__ == "__main__":
    main()
