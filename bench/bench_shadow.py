"""What a challenger in shadow (or canary) costs the champion's clients, side by side in one run.

Trains two XGBoost models on the generated wine data from the same preprocessed split (60 and 120
boosting rounds: the champion and the challenger), the stages as Ray jobs on a local 2-CPU
cluster, and deploys the champion through the Serve REST API exactly as RayServeDeployOperator
configures it. Then, on that one application, it measures five configurations, each the whole
Serve config PUT as the operator builds it (``app_config(..., challenger=, rollout=)``):

* ``alone``: the champion alone;
* ``challenger idle``: the challenger's replica up with its model loaded, the ingress sending it
  nothing (what the replica's being there costs);
* ``shadow 100%``: every request mirrored to the challenger after the champion answered;
* ``shadow 10%``: one request in ten mirrored;
* ``canary 10%``: one request in ten answered by the challenger.

Each measurement is ``--clients`` threads posting one row a request in a loop (taking turns over
512 distinct generated rows): a ``--warmup`` at that load first (not counted), then ``--seconds``
whose requests are counted. The configurations run in rounds whose order alternates (A B C D, then
D C B A, ...), so a drift of the machine's load falls on all of them alike; the table gives each
configuration's median over the rounds and its ratio to ``alone``. After a switch it waits until
``/rollout`` answers 200 (a rollout runs) or 404 (none), ``/health`` 200 and the application is
RUNNING, before measuring. At the end it prints what ``/rollout`` reported after each rollout's last
measurement (compared rows, agreement): the challenger did its work. A second table splits the CPU
time this cluster's processes used over the counted seconds (read from ``/proc``) by role, per
answered request: where the extra time goes.

With ``--rate`` each client sends at most that many requests a second (a service below its
capacity); without it they send as fast as they are answered, which saturates the cluster's CPUs,
so any work a challenger adds on the same CPUs shows in the champion's latency one for one.

``--configs`` measures some of them only (``alone`` always), e.g. ``--configs "shadow 100%"``.

Run: ``.venv/bin/python bench/bench_shadow.py [--seconds 15] [--warmup 8] [--rounds 2] [--clients 16] [--rate 8] [--configs ...]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include"), str(ROOT / "bench")]

from airflow_ray_ml_stages import wine  # noqa: E402
from bench_serve import prepared_data, run_stage  # noqa: E402
from scripts.localcluster import (  # noqa: E402
    LocalRayCluster, free_port, interrupt_on_termination, new_token, session_pids)

APP = "bench-shadow"
READY_TIMEOUT_S = 180.0
POOL_ROWS = 512  # distinct rows the clients take turns sending, one a request
READY_STREAK = 5  # answers in a row as expected before a configuration counts as live
# name, rollout mode (None: the champion alone), share
CONFIGS = (("alone", None, None), ("challenger idle", "idle", None), ("shadow 100%", "shadow", 1.0),
           ("shadow 10%", "shadow", 0.1), ("canary 10%", "canary", 0.1))


def row_pool() -> list[dict]:
    """Distinct rows for the clients to send (distinct, so the shadow's agreement is over varied predictions)."""
    return wine.generate(rows=POOL_ROWS, seed=5).drop(columns=[wine.LABEL]).to_dict(orient="records")


def load(url: str, clients: int, warmup: float, seconds: float, probe: Callable[[], dict[str, float]] = dict,
         rate: float = 0.0) -> tuple[list[float], int, int, dict[str, float]]:
    """``clients`` threads posting one row a request for ``warmup + seconds``, each at most ``rate``
    requests a second (0: the next as soon as one is answered); the latencies (ms) of the requests
    started after the warm-up, how many of those failed, how many the warm-up sent, and how much
    each of ``probe``'s numbers grew over the counted seconds."""
    bodies = [{"instances": [row]} for row in row_pool()]
    started = time.monotonic()
    counted_from, deadline = started + warmup, started + warmup + seconds
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failed, warm = [0] * clients, [0] * clients

    def client(index: int) -> None:
        session = requests.Session()
        turn = index
        while (sent := time.monotonic()) < deadline:
            body, turn = bodies[turn % len(bodies)], turn + clients
            begun = time.perf_counter()
            try:
                ok = session.post(url, json=body, timeout=30).status_code == 200
            except requests.RequestException:
                ok = False
            took = (time.perf_counter() - begun) * 1000
            if sent < counted_from:
                warm[index] += 1
            elif ok:
                latencies[index].append(took)
            else:
                failed[index] += 1
            if rate:
                time.sleep(max(0.0, sent + 1 / rate - time.monotonic()))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, counted_from - time.monotonic()))
    before = probe()
    for thread in threads:
        thread.join()
    after = probe()
    grown = {key: after[key] - before.get(key, 0.0) for key in after}
    return [ms for mine in latencies for ms in mine], sum(failed), sum(warm), grown


def cpu_seconds(cluster: LocalRayCluster) -> dict[str, float]:
    """CPU seconds (user + system) the cluster's processes have used so far, by role: the champion's
    replicas, the challenger's, the HTTP ingress (HAProxy, its manager and Serve's proxy actor),
    Serve's controller, the rest of Ray; and this process (the clients)."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {"ModelServer": 0.0, "Challenger": 0.0, "proxy": 0.0, "controller": 0.0, "rest of Ray": 0.0}
    for leader in cluster.leader_pids:
        for pid in session_pids(leader):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            role = next((name for name in ("ModelServer", "Challenger") if f":{APP}:{name}" in command), None)
            if role is None and ("ProxyActor" in command or "haproxy" in command.lower()):
                role = "proxy"
            elif role is None:
                role = "controller" if "ServeController" in command else "rest of Ray"
            used[role] += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    times = os.times()
    used["clients"] = times.user + times.system
    return used


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))] if ordered else float("nan")


def rollout_line(summary: dict) -> str:
    """The gist of a ``/rollout`` answer: requests each side, rows compared, agreement."""
    if "error" in summary:
        return f"/rollout answered HTTP {summary['error']}"
    mine, theirs = summary.get("challenger") or {}, summary.get("champion") or {}

    def number(value: object, digits: int = 3) -> str:
        return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "n/a"

    return (f"{summary.get('mode')} {summary.get('share'):g}: champion requests {theirs.get('requests')}, "
            f"challenger requests {mine.get('requests')} ({mine.get('failures')} failed), compared rows "
            f"{summary.get('compared_rows')}, agreement {number(summary.get('agreement'))}, mean abs difference "
            f"{number(summary.get('mean_abs_difference'))}; model ms p50 champion "
            f"{number((theirs.get('answer_ms') or {}).get('p50'), 2)}, challenger "
            f"{number((mine.get('answer_ms') or {}).get('p50'), 2)}")


def main() -> int:
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally that stops the cluster
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15, help="measured seconds per configuration and round")
    parser.add_argument("--warmup", type=float, default=8, help="seconds at load before each measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all configurations (order alternates)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--configs", default=",".join(name for name, _, _ in CONFIGS),
                        help="comma-separated configurations to measure (alone is always measured)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests a second per client (0: as fast as answered, which saturates the CPUs)")
    args = parser.parse_args()
    wanted = {"alone", *(name.strip() for name in args.configs.split(","))}
    unknown = wanted - {name for name, _, _ in CONFIGS}
    if unknown:
        parser.error(f"unknown configuration(s) {sorted(unknown)}; choose from {[name for name, _, _ in CONFIGS]}")
    configs = tuple(entry for entry in CONFIGS if entry[0] in wanted)
    made = [] if "AIRFLOW_HOME" in os.environ else [tempfile.mkdtemp(prefix="bench-airflow-")]
    os.environ.setdefault("AIRFLOW_HOME", made[0] if made else "")
    from airflow_ray_ml.ray_serve import RayServeDeployOperator
    from airflow_ray_ml.serve_rollout import Rollout

    began = time.monotonic()
    work = tempfile.mkdtemp(prefix="bench-shadow-")
    made.append(work)
    serve_port = free_port()
    cluster = LocalRayCluster(temp_dir=None, num_cpus=2, num_gpus=0, token=new_token())
    results: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _, _ in configs}
    stats: dict[str, dict] = {}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in configs}  # CPU ms a request, by role
    try:
        cluster.start()
        client, prep = prepared_data(cluster, work, serve_port)

        def train(name: str, rounds: int) -> dict:
            return run_stage(client, "train", {
                "artifact_dir": f"{work}/{name}", "train_uri": prep["split_uris"]["train"],
                "validation_uri": prep["split_uris"]["validation"], "test_uri": prep["split_uris"]["test"],
                "feature_columns": prep["feature_columns"], "label_column": prep["label_column"],
                "preprocessor_uri": prep["preprocessor_uri"],
                "config": {"family": "xgboost", "num_boost_round": rounds, "early_stopping_rounds": 0}})

        # no early stopping: it would stop both at the same round, and the two models would be one
        champion, challenger = train("champion", 60), train("challenger", 120)
        print(f"[setup] champion {champion['model_version']}, challenger {challenger['model_version']} "
              f"({time.monotonic() - began:.0f} s)", flush=True)

        # outside a DAG there is no DAG id to name the application after
        operator = RayServeDeployOperator(task_id="deploy", model=champion, app_name=APP, route_prefix=f"/{APP}")
        hook, url = operator.hook, f"{operator.endpoint}/predict"

        def config(mode: str | None, share: float | None) -> dict:
            idle = mode == "idle"  # the challenger's replica up and loaded, the ingress sending it nothing
            rollout = Rollout(mode="shadow" if idle else mode, share=1.0 if idle else share).user_config(
                challenger["model_version"]) if mode else None
            app = operator.app_config(champion, {}, "bench_shadow", challenger=challenger if mode else None,
                                      rollout=rollout)
            if idle:
                del app["deployments"][0]["user_config"]["rollout"]
            return operator.with_app(operator.start_settings(), [], app)

        def switch(mode: str | None, share: float | None) -> float:
            """PUT the configuration; wait until it routes as it says; return the seconds that took."""
            started = time.monotonic()
            hook.put_serve_applications(config(mode, share))
            expected, streak, last = (200 if mode and mode != "idle" else 404), 0, "no answer yet"
            while time.monotonic() < started + READY_TIMEOUT_S:
                app = operator.live_app(operator.serve_state()) or {}
                if app.get("status") in ("DEPLOY_FAILED", "UNHEALTHY"):
                    raise SystemExit(f"application {APP} is {app['status']}: {app.get('message', '')[-800:]}")
                try:
                    rollout = hook.get_endpoint_rollout(operator.route_prefix)
                    health = hook.get_endpoint_health(operator.route_prefix)
                    good = (app.get("status") == "RUNNING" and rollout.status_code == expected
                            and health.status_code == 200
                            and health.json().get("model_version") == champion["model_version"]
                            and (expected == 404 or rollout.json().get("mode") == mode
                                 and rollout.json().get("share") == share))
                    last = f"status {app.get('status')}, /rollout {rollout.status_code}, /health {health.status_code}"
                except Exception as err:  # the proxy may still be starting
                    good, last = False, f"{type(err).__name__}: {err}"
                streak = streak + 1 if good else 0
                if streak >= READY_STREAK:
                    return time.monotonic() - started
                time.sleep(0.2)
            raise SystemExit(f"{mode or 'alone'} did not become live within {READY_TIMEOUT_S:g} s ({last})")

        took = switch(None, None)
        print(f"[setup] champion serving in {took:.1f} s", flush=True)
        # Serve's autoscaler answers the load with its second replica (max_replicas 2, scaled down
        # only after 120 s idle): every configuration is measured in that steady state
        replicas = 0
        for _ in range(12):  # at most a minute: a loaded machine starts a replica slowly
            load(url, args.clients, 0, 5)
            deployments = (operator.live_app(operator.serve_state()) or {}).get("deployments") or {}
            replicas = sum(replica.get("state") == "RUNNING"
                           for replica in (deployments.get("ModelServer") or {}).get("replicas") or [])
            if replicas >= 2:
                break
        print(f"[setup] {replicas} champion replica(s) RUNNING; ready in {time.monotonic() - began:.0f} s", flush=True)

        live = None
        for round_index in range(args.rounds):
            order = configs if round_index % 2 == 0 else configs[::-1]
            for name, mode, share in order:
                took = 0.0
                if live != (mode, share):
                    took = switch(mode, share)
                    live = (mode, share)
                latencies, failed, warm, used = load(url, args.clients, args.warmup, args.seconds,
                                                     probe=lambda: cpu_seconds(cluster), rate=args.rate)
                cpu[name].append({role: seconds * 1000 / max(1, len(latencies)) for role, seconds in used.items()})
                p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
                results[name].append((p50, p99, len(latencies) / args.seconds, failed))
                if mode and mode != "idle":
                    reply = hook.get_endpoint_rollout(operator.route_prefix)
                    stats[name] = reply.json() if reply.status_code == 200 else {"error": reply.status_code}
                print(f"[round {round_index + 1}] {name:<12} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
                      f"{len(latencies) / args.seconds:6.1f} req/s  failed {failed}  (switch {took:.1f} s, "
                      f"warm-up {warm} requests)", flush=True)
    finally:
        cluster.stop()
        for path in made:  # the models and Airflow's home: this run's own
            shutil.rmtree(path, ignore_errors=True)

    loadavg = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    pace = f"each at most {args.rate:g} requests/s" if args.rate else "each as fast as answered"
    print(f"\nShadow and canary vs the champion alone: {args.clients} clients ({pace}), 1 row a request, "
          f"{args.seconds:g} s measured after {args.warmup:g} s warm-up, median of {args.rounds} round(s); "
          f"{time.monotonic() - began:.0f} s in all, load average {loadavg} ({os.cpu_count()} CPUs)\n")
    medians = {name: (statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds),
                      statistics.median(r[2] for r in rounds), sum(r[3] for r in rounds))
               for name, rounds in results.items()}
    base = medians["alone"]
    print(f"| {'configuration':<15} | {'p50 ms':>7} | {'p99 ms':>7} | {'p50 vs alone':>12} | {'p99 vs alone':>12} "
          f"| {'failed':>6} | {'req/s':>6} |")
    print(f"|{'-' * 17}|{'-' * 9}|{'-' * 9}|{'-' * 14}|{'-' * 14}|{'-' * 8}|{'-' * 8}|")
    for name, (p50, p99, rps, failed) in medians.items():
        print(f"| {name:<15} | {p50:>7.2f} | {p99:>7.2f} | {p50 / base[0]:>11.3f}x | {p99 / base[1]:>11.3f}x "
              f"| {failed:>6} | {rps:>6.1f} |")

    roles = list(next(iter(cpu["alone"]), {}))
    print(f"\nCPU ms per answered request, by process (median of rounds; {os.cpu_count()} CPUs):\n")
    print("| configuration | " + " | ".join(roles) + " | total |")
    print("|---|" + "---|" * (len(roles) + 1))
    for name, rounds in cpu.items():
        row = {role: statistics.median(r.get(role, 0.0) for r in rounds) for role in roles}
        print(f"| {name} | " + " | ".join(f"{row[role]:.2f}" for role in roles) + f" | {sum(row.values()):.2f} |")

    print("\n/rollout at the end of each rollout's last measurement:")
    for name, summary in stats.items():
        print(f"  {name:<12} {rollout_line(summary)}")
    shadows = [f"{name}: {medians[name][0] / base[0] - 1:+.1%}" for name in medians if name.startswith("shadow")]
    if shadows:
        print(f"\ngoal: shadow adds <= 5% to the clients' p50 -> {', '.join(shadows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
