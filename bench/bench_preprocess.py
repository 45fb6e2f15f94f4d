"""Benchmark the data stage: Ray Data vs pandas on one core, doing the same work, at three sizes.

    python bench/bench_preprocess.py                 # 6.5 k, 650 k and 6.5 M rows
    python bench/bench_preprocess.py --rows 6500 650000

For each size the generated wine data is written first (comma CSV shards of at most 650 k rows,
outside the timing). Then each engine runs in a fresh process:

* ``ray``: ``rayml.data.run_preprocess`` against a local 2-CPU Ray cluster that this script starts
  (and stops); the time excludes connecting the driver. Peak memory is the largest sum of PSS
  (proportional set size, so shared object-store pages are not counted twice) over the driver and
  every process of the Ray cluster, sampled every 0.2 s, minus the idle cluster's PSS.
* ``pandas``: the same validation, hash split, fit on train, transform and Parquet writes, through
  the same functions, on the whole table in one process; peak memory is its max RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except (psutil.Error, OSError):
            continue
    return total


def run_ray(paths: list[str], out: str, leader: int) -> dict:
    import ray

    import rayml
    from rayml.data import run_preprocess
    from rayml.localcluster import session_pids
    from rayml.specs import PreprocessSpec

    ray.init(runtime_env={"py_modules": [os.path.dirname(rayml.__file__)]}, logging_level="WARNING",
             log_to_driver=False)
    pids = lambda: [os.getpid(), *session_pids(leader)]  # noqa: E731
    idle = _pss(pids())
    peak = [idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _pss(pids()))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    result = run_preprocess(PreprocessSpec(artifact_dir=out, source=paths, label_range=[0, 10]))
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    return {"seconds": seconds, "peak_mb": (peak[0] - idle) / 2**20, "rows": result.rows}


def run_pandas(paths: list[str], out: str) -> dict:
    import pandas as pd

    from rayml import artifacts
    from rayml.data import BatchContext, build_profile, merge_summaries, raise_findings, summarise, transform
    from rayml.preprocessor import Moments, Preprocessor
    from rayml.specs import PreprocessSpec
    from rayml.wine import FEATURES, LABEL, TYPE_COLUMN

    spec = PreprocessSpec(artifact_dir=out, source=paths, label_range=[0, 10])
    started = time.perf_counter()
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
    artifacts.write_json_atomic(f"{out}/profile.json", build_profile(total, ctx.plan, spec, [], ""))
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mb": peak_kb / 1024,
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
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{engine} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


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
                shutil.rmtree(work / f"out-{engine}-{rows}", ignore_errors=True)
            print(f"done {rows} rows: {json.dumps(results)}", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    header = (f"{'rows':>10} | {'pandas rows/s':>13} | {'ray rows/s':>11} | {'ray/pandas speed':>16} | "
              f"{'pandas peak MB':>14} | {'ray peak MB':>11} | {'ray/pandas mem':>14}")
    print(header)
    print("-" * len(header))
    for rows, results in rows_out:
        pandas, ray = results["pandas"], results["ray"]
        print(f"{rows:>10,} | {rows / pandas['seconds']:>13,.0f} | {rows / ray['seconds']:>11,.0f} | "
              f"{pandas['seconds'] / ray['seconds']:>15.2f}x | {pandas['peak_mb']:>14,.0f} | "
              f"{ray['peak_mb']:>11,.0f} | {ray['peak_mb'] / pandas['peak_mb']:>13.2f}x")


if __name__ == "__main__":
    main()
