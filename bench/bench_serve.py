"""Serve app vs plain FastAPI + uvicorn, same model artifact, side by side in one run.

Trains a small XGBoost model on the generated wine data (stages as Ray jobs on a local 2-CPU
cluster), deploys it through the Serve REST API exactly as RayServeDeployOperator configures it,
starts the plain server on the same model directory, then measures for each: latency p50/p99 at
one client (4 rows a request) and steady-state throughput at 16 concurrent clients (after an
8-second warm-up at that load, which gives Serve's autoscaler time to add its second replica).

Run: ``.venv/bin/python bench/bench_serve.py [--requests 400] [--seconds 15]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from airflow_ray_ml_stages import wine  # noqa: E402
from scripts.localcluster import LocalRayCluster, free_port, interrupt_on_termination, new_token  # noqa: E402

ROW_COUNT = 4


def run_stage(client, stage: str, spec: dict) -> dict:
    from airflow_ray_ml.ray_job import RAYML_PACKAGE_DIR, manifest_from_log

    submission = client.submit_job(
        entrypoint=f"python -m airflow_ray_ml_stages.{stage} --spec '{json.dumps(spec)}'",
        runtime_env={"py_modules": [RAYML_PACKAGE_DIR], "env_vars": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}},
    )
    while not client.get_job_status(submission).is_terminal():
        time.sleep(0.5)
    manifest = manifest_from_log(client.get_job_logs(submission))
    if not manifest or manifest["status"] != "succeeded":
        raise SystemExit(f"stage {stage} failed: {client.get_job_logs(submission)[-2000:]}")
    return manifest


def prepared_data(cluster: LocalRayCluster, work: str, serve_port: int):
    """Point the ``ray_default`` connection at ``cluster`` (artifacts in ``work``, Serve on ``serve_port``),
    then generate the wine data and preprocess it as Ray jobs: the job client and the preprocess manifest."""
    from ray.job_submission import JobSubmissionClient

    os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": cluster.dashboard_url, "auth_token": cluster.token, "artifact_root": work,
        "serve_url": f"http://127.0.0.1:{serve_port}"}})
    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
    data = run_stage(client, "generate", {"artifact_dir": f"{work}/data", "rows": 3000, "seed": 1})
    return client, run_stage(client, "data", {"artifact_dir": f"{work}/prep", "source": data["data_uris"],
                                              "label_column": wine.LABEL, "label_range": [0, 10]})


def rows() -> list[dict]:
    frame = wine.generate(rows=ROW_COUNT * 10, seed=5).drop(columns=[wine.LABEL])
    return frame.head(ROW_COUNT).to_dict(orient="records")


def latency(url: str, count: int) -> tuple[float, float]:
    body = {"instances": rows()}
    session = requests.Session()
    for _ in range(20):  # warm-up
        session.post(url, json=body, timeout=30).raise_for_status()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        session.post(url, json=body, timeout=30).raise_for_status()
        times.append(time.perf_counter() - started)
    times.sort()
    return statistics.median(times) * 1000, times[int(0.99 * (len(times) - 1))] * 1000


def throughput(url: str, clients: int, seconds: float) -> tuple[float, int]:
    body = {"instances": rows()}
    done, failed = [0] * clients, [0] * clients
    deadline = time.monotonic() + seconds

    def client(index: int) -> None:
        session = requests.Session()
        while time.monotonic() < deadline:
            reply = session.post(url, json=body, timeout=30)
            if reply.status_code == 200:
                done[index] += 1
            else:
                failed[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds, sum(failed)


def main() -> int:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-airflow-"))
    from airflow_ray_ml.ray_serve import RayServeDeployOperator

    work = tempfile.mkdtemp(prefix="bench-serve-")
    serve_port, plain_port = free_port(), free_port()
    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="bs", dir="/tmp"), num_cpus=2, num_gpus=0, token=new_token())
    plain = None
    try:
        cluster.start()
        client, prep = prepared_data(cluster, work, serve_port)
        model = run_stage(client, "train", {
            "artifact_dir": f"{work}/train", "train_uri": prep["split_uris"]["train"],
            "validation_uri": prep["split_uris"]["validation"], "test_uri": prep["split_uris"]["test"],
            "feature_columns": prep["feature_columns"], "label_column": prep["label_column"],
            "preprocessor_uri": prep["preprocessor_uri"], "config": {"family": "xgboost", "num_boost_round": 50}})

        # outside a DAG there is no DAG id to name the application after
        operator = RayServeDeployOperator(task_id="deploy", model=model, app_name="bench-serve",
                                          route_prefix="/bench-serve")
        config = operator.with_app(operator.start_settings(), [], operator.app_config(model, {}, "bench_serve"))
        operator.hook.put_serve_applications(config)
        operator.wait_for_version(model["model_version"], time.monotonic() + 180)

        # Ray gives each replica OMP_NUM_THREADS=1 (a fraction of a CPU); the plain server gets the
        # same, or XGBoost's OpenMP threads spin against the request threads and it is unfairly slow.
        plain = subprocess.Popen([sys.executable, str(ROOT / "bench" / "plain_server.py"), model["model_dir"],
                                  str(plain_port)], start_new_session=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
        plain_url = f"http://127.0.0.1:{plain_port}/predict"
        for _ in range(100):
            try:
                requests.get(f"http://127.0.0.1:{plain_port}/docs", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.2)

        results = {}
        for name, url in (("plain FastAPI", plain_url), ("Ray Serve app", f"{operator.endpoint}/predict")):
            p50, p99 = latency(url, args.requests)
            throughput(url, args.clients, 8)  # warm-up under load: lets Serve's autoscaler react
            rps, failed = throughput(url, args.clients, args.seconds)
            results[name] = (p50, p99, rps, failed)
    finally:
        if plain is not None:
            plain.terminate()
            plain.wait()
        cluster.stop()

    base = results["plain FastAPI"]
    print(f"\nServe vs plain FastAPI ({ROW_COUNT} rows a request; latency over {args.requests} requests at "
          f"1 client, throughput over {args.seconds:g} s at {args.clients} clients)\n")
    print(f"{'server':<16} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'failed':>7} {'p50 vs plain':>13} {'req/s vs plain':>15}")
    for name, (p50, p99, rps, failed) in results.items():
        print(f"{name:<16} {p50:>8.2f} {p99:>8.2f} {rps:>8.1f} {failed:>7} {p50 / base[0]:>12.2f}x {rps / base[2]:>14.2f}x")
    serve = results["Ray Serve app"]
    print(f"\ngoals: p50 <= 3x plain -> {serve[0] / base[0]:.2f}x; throughput >= 0.8x plain -> {serve[2] / base[2]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
