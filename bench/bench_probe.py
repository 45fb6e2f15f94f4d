"""How fast the GPU probe decides, next to the common hand-made pattern.

Scenarios, each on its own local 2-CPU Ray cluster started here:

* CPU-only cluster: GPUProbeOperator (State API only, no job) vs the hand-made pattern that
  submits a ``num_gpus=1`` task and waits for it with a timeout (four minutes in the wild).
* A cluster that advertises a GPU CUDA cannot use (``--num-gpus=1`` on this CPU machine):
  GPUProbeOperator (Ray job + CUDA smoke test) deciding CPU with the reason.

Run: ``.venv/bin/python bench/bench_probe.py [--repeats 5] [--naive-timeout 240]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from scripts.localcluster import LocalRayCluster, interrupt_on_termination, new_token  # noqa: E402


def _context(run: int) -> dict:
    ti = SimpleNamespace(dag_id="bench_probe", map_index=-1, xcom_push=lambda **_: None)
    return {"ti": ti, "run_id": f"bench-{time.time_ns()}-{run}"}


def time_operator(conn_id: str, repeats: int) -> tuple[list[float], dict]:
    from airflow_ray_ml.gpu_probe import GPUProbeOperator

    times, compute = [], {}
    for run in range(repeats):
        operator = GPUProbeOperator(task_id="probe", ray_conn_id=conn_id, poll_interval_s=0.2)
        started = time.perf_counter()
        compute = operator.execute(_context(run))
        times.append(time.perf_counter() - started)
    return times, compute


def time_naive(cluster: LocalRayCluster, timeout_s: float) -> float:
    """The hand-made pattern: a num_gpus=1 task and ray.wait with a timeout, in a fresh driver."""
    from tests.child import run_python

    code = (
        "import ray, time\n"
        "ray.init(logging_level='ERROR')\n"
        "t = time.perf_counter()\n"
        "ref = ray.remote(num_gpus=1)(lambda: 1).remote()\n"
        f"ready, _ = ray.wait([ref], timeout={timeout_s})\n"
        "ray.cancel(ref, force=True) if not ready else None\n"
        "report(time.perf_counter() - t)\n"
    )
    env = dict(os.environ, RAY_ADDRESS=cluster.address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token)
    return float(run_python(code, env=env).result)


def _connect(conn_id: str, cluster: LocalRayCluster) -> None:
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps({
        "conn_type": "ray_ml",
        "extra": {"dashboard_url": cluster.dashboard_url, "auth_token": cluster.token,
                  "artifact_root": tempfile.mkdtemp(prefix="bench-probe-")},
    })


def main() -> int:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--naive-timeout", type=float, default=240.0)
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-airflow-"))

    rows = []
    cpu = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bc", dir="/tmp"), num_cpus=2, num_gpus=0, token=new_token())
    fake = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bg", dir="/tmp"), num_cpus=2, num_gpus=1,
                           token=new_token())
    try:
        cpu.start()
        _connect("bench_cpu", cpu)
        times, compute = time_operator("bench_cpu", args.repeats)
        probe_cpu = statistics.median(times)
        naive = time_naive(cpu, args.naive_timeout)
        rows.append(("CPU-only", "GPUProbeOperator", probe_cpu, compute["use_gpu"], compute["reason"]))
        rows.append(("CPU-only", f"num_gpus=1 task + wait({args.naive_timeout:g} s)", naive, False,
                     "timed out waiting for a GPU"))
        cpu.stop()

        fake.start()
        _connect("bench_fake", fake)
        times, compute = time_operator("bench_fake", args.repeats)
        rows.append(("GPU advertised, unusable", "GPUProbeOperator", statistics.median(times),
                     compute["use_gpu"], compute["reason"][:70]))
    finally:
        cpu.stop()
        fake.stop()

    print(f"\nGPU probe decision time (median of {args.repeats}; hand-made pattern run once)\n")
    print(f"{'cluster':<26} {'method':<36} {'seconds':>8} {'vs naive':>9}  use_gpu  reason")
    for cluster, method, seconds, use_gpu, reason in rows:
        print(f"{cluster:<26} {method:<36} {seconds:>8.2f} {seconds / naive:>8.3f}x  {str(use_gpu):<7}  {reason}")
    print(f"\ngoal: <= 2 s on the CPU-only cluster -> {'met' if probe_cpu <= 2 else 'NOT met'} ({probe_cpu:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
