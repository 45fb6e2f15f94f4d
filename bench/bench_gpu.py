"""Benchmark for a GPU node: where the GPU pays, and what each stage costs with it and without it.

On a machine with a CUDA GPU, in one run (a machine without one prints "no CUDA GPU: skipped" and
exits 0, unless ``--cpu-only`` asks for the CPU half as a smoke check):

(a) **Training side by side**, on the wine data (the project's generator) at 1x, 100x and 1000x
    the rows, each on the GPU and on CPU: a plain PyTorch loop, plain Lightning (both
    ``bench/plain_train.py`` in a fresh process, imports included) and the train stage as
    ``RayTrainOperator`` runs it (``execute`` against a local Ray cluster: the operator plans,
    gives the job the GPU with ``entrypoint_num_gpus``, and follows the job to its manifest);
    the same for XGBoost (plain ``xgboost.train`` and the stage). ``accelerator`` pins the device,
    so the device rule does not choose here: this part is what its thresholds come from.
(b) **Each pipeline stage** (probe, preprocess, tune, train, as their operators run them) on the
    wine demo data with the GPU visible (a cluster that advertises it) and hidden (a second
    cluster with ``num_gpus=0`` and ``CUDA_VISIBLE_DEVICES=""``), ``accelerator`` left to the rule.
(c) **The GPU's busy share** during each run: ``utilization.gpu`` (the share of time a kernel
    ran) sampled every 0.2 s through pynvml where it imports, ``nvidia-smi`` otherwise.

It prints a table of ratios per part. The whole run is kept to ``--budget-s`` (default 330 s of
work on one H200 + 16 cores, so about 6 minutes with the clusters' start-up): what is left when
the budget is spent is skipped and listed, 1000x last in (a). Everything it starts (clusters,
plain scripts, the sampler) is stopped on exit, also on SIGTERM/SIGHUP.

Usage::

    python bench/bench_gpu.py [--scales 1 100 1000] [--epochs 10 2 1] [--rounds 100 50 20]
                              [--batch-size 256] [--tune-trials 6] [--budget-s 330]
    python bench/bench_gpu.py --cpu-only --scales 1 --epochs 2 --rounds 10 --tune-trials 2   # smoke check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402

WINE_ROWS = 6497
SAMPLE_INTERVAL_S = 0.2


def cuda_gpus() -> int:
    """CUDA GPUs this process can use (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class GpuBusy:
    """The first GPU's ``utilization.gpu`` (% of the sample period a kernel ran), sampled in the background."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.source = "none"
        self._stop = threading.Event()
        self._process: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "GpuBusy":
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "pynvml"
            self._thread = threading.Thread(target=self._poll, args=(pynvml, handle), daemon=True)
        except Exception:  # no pynvml, or it cannot reach the driver: nvidia-smi's own loop
            if not shutil.which("nvidia-smi"):
                return self
            self.source = "nvidia-smi"
            self._process = subprocess.Popen(
                ["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 f"--loop-ms={int(SAMPLE_INTERVAL_S * 1000)}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _poll(self, pynvml, handle) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.samples.append((time.monotonic(), float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))

    def _read(self) -> None:
        for line in self._process.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.strip())))
            except ValueError:
                continue

    def during(self, started: float, ended: float) -> tuple[float, float] | None:
        """Mean busy % and the share of samples with the GPU busy at all, between two monotonic times."""
        window = [value for at, value in self.samples if started <= at <= ended]
        if not window:
            return None
        return statistics.fmean(window), sum(value > 0 for value in window) / len(window)

    def stop(self) -> None:
        self._stop.set()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()


def _context(task_id: str) -> dict:
    ti = SimpleNamespace(dag_id="bench_gpu", task_id=task_id, map_index=-1, xcom_push=lambda **_: None)
    return {"ti": ti, "run_id": f"bench-{time.time_ns()}"}


def _connect(conn_id: str, cluster: LocalRayCluster, artifact_root: Path) -> str:
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({
        "conn_type": "ray_ml",
        "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token,
                  "artifact_root": str(artifact_root)},
    })
    return conn_id


class Bench:
    """Timed runs, each with the GPU's busy share over its own window, within one budget."""

    def __init__(self, budget_s: float, busy: GpuBusy) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.busy = busy
        self.runs: list[dict] = []
        self.skipped: list[str] = []

    def left(self, what: str) -> bool:
        """Whether there is budget left for ``what``; notes it as skipped if not."""
        if time.monotonic() - self.started < self.budget_s:
            return True
        self.skipped.append(what)
        print(f"skipped (budget of {self.budget_s:g} s spent): {what}", flush=True)
        return False

    def time(self, part: str, key: dict, call) -> dict:
        started = time.monotonic()
        details = call()
        ended = time.monotonic()
        busy = self.busy.during(started, ended)
        run = {"part": part, **key, "seconds": ended - started, **details,
               "gpu_busy_mean": None if busy is None else busy[0], "gpu_busy_share": None if busy is None else busy[1]}
        self.runs.append(run)
        print("run:", json.dumps(run, default=str), flush=True)
        return run


def plain(family: str, fields: dict, iterations: int, device: str, threads: int, batch_size: int) -> dict:
    """``bench/plain_train.py`` in a fresh process (spawn to exit): its JSON line."""
    from tests.child import read_result, result_file

    splits = {name: fields[f"{name}_uri"] for name in ("train", "validation", "test")}
    result_path = result_file()
    output = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "plain_train.py"), "--family", family, "--splits", json.dumps(splits),
         "--features", json.dumps(fields["feature_columns"]), "--iterations", str(iterations), "--device", device,
         "--threads", str(threads), *(["--batch-size", str(batch_size)] if family != "xgboost" else []),
         "--result", result_path],
        capture_output=True, text=True, check=False,
    )
    if output.returncode:
        raise SystemExit(f"plain_train.py --family {family} --device {device} failed:\n{output.stderr[-3000:]}")
    result = read_result(result_path)
    return {"rmse": result["test_rmse"], "fit_s": result.get("fit_s")}


def stage_train(conn_id: str, data: dict, config: dict, compute: dict, accelerator: str) -> dict:
    """The train stage as RayTrainOperator runs it: plan, submit, follow, read the manifest."""
    from airflow_ray_ml.ray_train import RayTrainOperator

    operator = RayTrainOperator(task_id="train", ray_conn_id=conn_id, poll_interval_s=0.2, data=data, config=config,
                                compute=compute, accelerator=accelerator)
    manifest = operator.execute(_context("train"))
    used, training = manifest["compute_used"], manifest["training"]
    return {"rmse": manifest["metrics"]["test"]["rmse"], "fit_s": training.get("fit_s"), "runner": training["runner"],
            "device": used["device"], "job_gpus": operator.entrypoint_num_gpus or 0}


def training_side_by_side(bench: Bench, args, work: Path, conn_id: str, computes: dict[str, dict],
                          devices: list[str]) -> None:
    """Part (a): each contender on each device at each scale; 1000x last, so the budget cuts it first."""
    from tests.train_data import as_preprocess_xcom, write_splits

    threads = max(1, int(computes["cpu"]["cpus_per_worker"]))
    for scale, epochs, rounds in zip(args.scales, args.epochs, args.rounds):
        if not bench.left(f"(a) {scale}x"):
            continue
        fields = write_splits(work / f"wine{scale}x", rows=WINE_ROWS * scale)
        data = as_preprocess_xcom(fields)
        lightning = {"family": "lightning", "max_epochs": epochs, "patience": 0, "batch_size": args.batch_size}
        xgboost = {"family": "xgboost", "num_boost_round": rounds, "early_stopping_rounds": 0}
        contenders = [
            ("lightning", "PyTorch loop", epochs, lambda device: plain("torch", fields, epochs, device, threads,
                                                                       args.batch_size)),
            ("lightning", "Lightning", epochs, lambda device: plain("lightning", fields, epochs, device, threads,
                                                                    args.batch_size)),
            ("lightning", "stage", epochs, lambda device: stage_train(conn_id, data, lightning, computes[device],
                                                                      "gpu" if device == "cuda" else "cpu")),
            ("xgboost", "XGBoost", rounds, lambda device: plain("xgboost", fields, rounds, device, threads, 0)),
            ("xgboost", "stage", rounds, lambda device: stage_train(conn_id, data, xgboost, computes[device],
                                                                    "gpu" if device == "cuda" else "cpu")),
        ]
        for family, contender, iterations, call in contenders:
            for device in devices:  # GPU and CPU back to back: the same machine state for both
                if bench.left(f"(a) {scale}x {family} {contender} on {device}"):
                    bench.time("a", {"scale": scale, "family": family, "contender": contender, "device": device,
                                     "iterations": iterations, "train_rows": data["rows"]["train"]},
                               lambda: call(device))


def pipeline_stages(bench: Bench, args, clusters: dict[str, str], demo_files: list[str]) -> None:
    """Part (b): probe, preprocess, tune and train as their operators run them, GPU visible and hidden."""
    from airflow_ray_ml.gpu_probe import GPUProbeOperator
    from airflow_ray_ml.ray_data import RayDataPreprocessOperator
    from airflow_ray_ml.ray_train import RayTrainOperator
    from airflow_ray_ml.ray_tune import RayTuneOperator
    from airflow_ray_ml_stages.search_space import default_search_space

    space = default_search_space(max_epochs=args.tune_epochs, num_boost_round=args.tune_rounds)
    for gpu, conn_id in clusters.items():
        if not bench.left(f"(b) stages, GPU {gpu}"):
            continue
        found: dict = {}

        def run(stage: str, operator, note) -> None:
            def call() -> dict:
                found[stage] = operator.execute(_context(operator.task_id))
                return {"note": note(found[stage])}
            bench.time("b", {"stage": stage, "gpu": gpu}, call)

        run("probe", GPUProbeOperator(task_id="probe", ray_conn_id=conn_id),
            lambda compute: f"use_gpu={compute['use_gpu']}: {compute['reason'][:60]}")
        run("preprocess", RayDataPreprocessOperator(task_id="preprocess", ray_conn_id=conn_id, poll_interval_s=0.2,
                                                    source=demo_files, label_column="quality", label_range=[0, 10]),
            lambda data: f"{data['rows']['train']:,} training rows")
        run("tune", RayTuneOperator(task_id="tune", ray_conn_id=conn_id, poll_interval_s=0.2, data=found["preprocess"],
                                    compute=found["probe"], num_samples=args.tune_trials, search_space=space),
            lambda result: f"{result['trials']}, per trial {result.get('resources_per_trial')}")
        run("train", RayTrainOperator(task_id="train", ray_conn_id=conn_id, poll_interval_s=0.2,
                                      data=found["preprocess"], config=found["tune"]["best_config"],
                                      compute=found["probe"]),
            lambda manifest: (f"{manifest['family']} on {manifest['compute_used']['device']}, "
                              f"{manifest['training']['runner']}: {manifest['compute_used'].get('device_reason')}"))


def _seconds(run: dict | None) -> str:
    return f"{run['seconds']:.1f}" if run else "-"


def _busy(run: dict | None) -> str:
    if not run or run["gpu_busy_mean"] is None:
        return "-"
    return f"{run['gpu_busy_mean']:.0f} % ({100 * run['gpu_busy_share']:.0f} %)"


def print_tables(bench: Bench, devices: list[str], source: str) -> None:
    runs = bench.runs
    part_a = [run for run in runs if run["part"] == "a"]
    if part_a:
        print("\n(a) Training side by side: seconds from start to result (plain: spawn to exit; stage: the operator's "
              "execute), GPU busy: mean utilization (share of samples busy)\n")
        print("| family | rows | contender | GPU s | CPU s | CPU ÷ GPU | ÷ plain Lightning (GPU / CPU) | GPU busy | "
              "test rmse (GPU / CPU) | stage runner (GPU) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        keys = sorted(dict.fromkeys((run["family"], run["scale"], run["contender"]) for run in part_a),
                      key=lambda key: (key[0], key[1]))  # stable: the contenders in the order they ran
        by = {(run["family"], run["scale"], run["contender"], run["device"]): run for run in part_a}
        for family, scale, contender in keys:
            gpu, cpu = by.get((family, scale, contender, "cuda")), by.get((family, scale, contender, "cpu"))
            reference = {device: by.get(("lightning", scale, "Lightning", device)) for device in ("cuda", "cpu")}
            versus = " / ".join(
                f"{mine['seconds'] / reference[device]['seconds']:.2f}" if mine and reference[device] else "-"
                for device, mine in (("cuda", gpu), ("cpu", cpu)))
            ratio = f"{cpu['seconds'] / gpu['seconds']:.2f}" if gpu and cpu else "-"
            rows = (gpu or cpu)["train_rows"]
            rmse = " / ".join(f"{run['rmse']:.4f}" if run else "-" for run in (gpu, cpu))
            runner = f"{gpu.get('runner')} on {gpu.get('device')}" if gpu and gpu.get("runner") else "-"
            print(f"| {family} | {rows:,} ({scale}x) | {contender} | {_seconds(gpu)} | {_seconds(cpu)} | {ratio} | "
                  f"{versus if family == 'lightning' else '-'} | {_busy(gpu)} | {rmse} | {runner} |")
        print("\nCPU ÷ GPU above 1: the GPU is faster. The device rule's thresholds (include/airflow_ray_ml_stages/"
              "device.py) are the rows from which the stage's CPU ÷ GPU passes 1.")
    part_b = [run for run in runs if run["part"] == "b"]
    if part_b:
        print("\n(b) Each stage as its operator runs it, GPU visible and hidden (seconds; visible ÷ hidden at most "
              "1.1 is the goal)\n")
        print("| stage | GPU visible s | GPU hidden s | visible ÷ hidden | GPU busy (visible) | visible: | hidden: |")
        print("|---|---|---|---|---|---|---|")
        by = {(run["stage"], run["gpu"]): run for run in part_b}
        totals = {"visible": 0.0, "hidden": 0.0}
        for stage in ("probe", "preprocess", "tune", "train"):
            visible, hidden = by.get((stage, "visible")), by.get((stage, "hidden"))
            for name, run in (("visible", visible), ("hidden", hidden)):
                totals[name] += run["seconds"] if run else 0.0
            ratio = f"{visible['seconds'] / hidden['seconds']:.2f}" if visible and hidden else "-"
            print(f"| {stage} | {_seconds(visible)} | {_seconds(hidden)} | {ratio} | {_busy(visible)} | "
                  f"{visible['note'] if visible else '-'} | {hidden['note'] if hidden else '-'} |")
        if totals["hidden"] and totals["visible"]:
            print(f"| all four | {totals['visible']:.1f} | {totals['hidden']:.1f} | "
                  f"{totals['visible'] / totals['hidden']:.2f} | | | |")
    print(f"\nGPU busy from {source}; devices run: {devices}; machine: {os.cpu_count()} CPUs, "
          f"{cuda_gpus()} CUDA GPU(s); work took {time.monotonic() - bench.started:.0f} s of the {bench.budget_s:g} s "
          "budget.")
    if bench.skipped:
        print("skipped for the budget: " + "; ".join(bench.skipped))


def main() -> int:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the clusters
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 100, 1000], help="times the wine rows (6,497)")
    parser.add_argument("--epochs", type=int, nargs="+", default=[10, 2, 1], help="Lightning epochs, one per scale")
    parser.add_argument("--rounds", type=int, nargs="+", default=[100, 50, 20], help="XGBoost rounds, one per scale")
    parser.add_argument("--batch-size", type=int, default=256, help="Lightning batch size (the search space's largest)")
    parser.add_argument("--tune-trials", type=int, default=6, help="(b): trials of the search")
    parser.add_argument("--tune-epochs", type=int, default=10, help="(b): Lightning epochs per trial")
    parser.add_argument("--tune-rounds", type=int, default=200, help="(b): XGBoost rounds per trial")
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop starting runs after this much work")
    parser.add_argument("--cpu-only", action="store_true", help="no GPU needed: the CPU runs only, as a smoke check")
    parser.add_argument("--skip-stages", action="store_true", help="leave out part (b)")
    args = parser.parse_args()
    if not (len(args.scales) == len(args.epochs) == len(args.rounds)):
        parser.error("--scales, --epochs and --rounds take one value per scale each")
    gpus = cuda_gpus()
    if not gpus and not args.cpu_only:
        print("no CUDA GPU: skipped")
        return 0
    devices = ["cpu"] if args.cpu_only else ["cuda", "cpu"]
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-gpu-airflow-"))
    # the jobs' log lines, which the operators copy to their task log: not wanted between the runs
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")

    from airflow_ray_ml.ray_job import RayJobOperator
    from airflow_ray_ml_stages.probe import NodeResources, plan_cpu, plan_gpu

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    # CPU-only: a 2-CPU cluster (the smoke check shares a small machine); on a GPU node: all of it.
    num_cpus = 2 if args.cpu_only else None
    visible = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bv", dir="/tmp"), num_cpus=num_cpus,
                              num_gpus=0 if args.cpu_only else None, token=new_token())
    hidden = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bh", dir="/tmp"), num_cpus=num_cpus, num_gpus=0,
                             token=new_token(), extra_env={"CUDA_VISIBLE_DEVICES": ""})
    busy = GpuBusy()
    bench = Bench(args.budget_s, busy)
    try:
        if gpus:
            busy.start()
        visible.start()
        hidden.start()
        clusters = {"visible": _connect("bench_gpu_visible", visible, work / "visible"),
                    "hidden": _connect("bench_gpu_hidden", hidden, work / "hidden")}
        demo_files: list[str] = []
        for gpu, conn_id in clusters.items():  # the package upload, once per cluster, and the demo files
            generated = RayJobOperator(task_id="demo_data", ray_conn_id=conn_id, stage="generate", poll_interval_s=0.2,
                                       spec={"rows": WINE_ROWS, "seed": 7, "file_format": "uci"}).execute(
                _context("demo_data"))
            demo_files = demo_files or generated["data_uris"]
        bench.started = time.monotonic()  # the budget counts the work, not the clusters' start-up
        # what the probe plans on this node, on GPU and on CPU: the stage's compute in part (a)
        node = [NodeResources("head", float(num_cpus or os.cpu_count()), float(0 if args.cpu_only else gpus))]
        computes = {"cpu": plan_cpu(node, 1, "bench: CPU").to_dict()}
        if not args.cpu_only:
            computes["cuda"] = plan_gpu(node, 1, "bench: GPU", devices=[]).to_dict()
        training_side_by_side(bench, args, work, clusters["visible"], computes, devices)
        if not args.skip_stages:
            pipeline_stages(bench, args, clusters if not args.cpu_only else {"hidden": clusters["hidden"]},
                            demo_files)
    finally:
        busy.stop()
        visible.stop()
        hidden.stop()
        shutil.rmtree(work, ignore_errors=True)
    print_tables(bench, devices, busy.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
