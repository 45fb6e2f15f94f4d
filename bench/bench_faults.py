"""Reliability under faults: each fault made on a local stack this bench starts, one table of results.

The bench starts one local 2-CPU Ray cluster (token auth, no GPU advertised, bound to 127.0.0.1)
and a throw-away Airflow home with a SQLite metadata DB, and makes the faults one after the other.
Tasks run as they do in the tests: ``dag.test()`` on the small DAGs of ``bench/fault_dags.py``, each
in its own process (its own session, so the bench can SIGKILL it as a crashed worker dies), with
the run conf naming the data: the generated wine data (the generate and data stages as Ray jobs,
4,000 rows).

- ``promotion``: 16 client threads POST ``/predict`` to a served application without pause; once
  Serve's autoscaler has its second replica up, the deploy DAG promotes a better model (a hot swap
  through RayServeDeployOperator); then again while a training job (the train stage, local mode)
  runs on the same CPUs. Counted: requests, failures (non-200 answers and exceptions), and the
  longest time without any successful answer across all clients, from the deploy task's start to
  its end (the times its log gives); the same longest gap while its process started, for reference.
- ``kill_task``: the task process running RayTuneOperator, then RayTrainOperator, is SIGKILLed (its
  whole process group) while its Ray job is RUNNING; then the same DAG run goes again (same logical
  date, so the same run id, as Airflow's retry of that task run). Counted: the Ray jobs of that task
  run, whether the job was still RUNNING when the retry began, and what the retry did with it.
- ``kill_worker``: the Ray Train worker process (one worker, a checkpoint every epoch) is SIGKILLed
  once a checkpoint is registered. Read from the train manifest: restarts and the epoch it resumed from.
- ``head``: the cluster (head and all) is stopped by its own ``stop()`` while the train job runs;
  the task's error is checked, a new cluster is started on the same ports with the same token, and
  Airflow's retry of the task (``retries=2``, 30 s apart) runs on it.

Run: ``.venv/bin/python bench/bench_faults.py [--only promotion|kill_task|kill_worker|head] [--clients 16]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from airflow_ray_ml_stages import wine  # noqa: E402
from scripts.localcluster import (  # noqa: E402
    LocalRayCluster, free_port, interrupt_on_termination, new_token, remove_temp_dir,
)

FAULTS = ("promotion", "kill_task", "kill_worker", "head")
DAG_FILE = ROOT / "bench" / "fault_dags.py"
GAP_GOAL_S = 0.2
ROWS_PER_REQUEST = 4
DATA_ROWS = 4000
# xgboost models of known order (the serve tests' recipe): one shallow round learns little, more learn more
MODELS = {
    "worse": {"family": "xgboost", "num_boost_round": 1, "eta": 0.05, "max_depth": 2},
    "good": {"family": "xgboost", "num_boost_round": 8, "eta": 0.1, "max_depth": 3},
    "better": {"family": "xgboost", "num_boost_round": 120, "eta": 0.08, "max_depth": 4},
}
BASE_DATE = datetime(2026, 6, 1, tzinfo=timezone.utc)

_children: list[subprocess.Popen] = []  # task processes this bench started, stopped by process group


# -- the Airflow side ------------------------------------------------------------------------------


def airflow_env(home: str) -> None:
    """A throw-away Airflow home whose only DAG bundle holds bench/fault_dags.py, and its DB."""
    bundle = Path(home) / "dags"
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / DAG_FILE.name).symlink_to(DAG_FILE)
    os.environ.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(bundle),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "RAY_USAGE_STATS_ENABLED": "0",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
            {"name": "fault-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
             "kwargs": {"path": str(bundle)}},
        ]),
    })
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAYML_ARTIFACT_ROOT"):
        os.environ.pop(name, None)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=os.environ.copy())


def dag_test_main(dag_id: str, logical_date: str, conf_file: str, result_file: str) -> int:
    """In a task process: run one DAG with dag.test() and write its end state and XComs as JSON."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"fault_dags.py did not import: {bag.import_errors}")
    date = datetime.fromisoformat(logical_date)
    dag_run = bag.dags[dag_id].test(logical_date=date, run_after=date,
                                    run_conf=json.loads(Path(conf_file).read_text()))
    result = {"state": str(dag_run.state), "run_id": dag_run.run_id, "tasks": {}, "xcom": {}}
    with create_session() as session:
        for ti in dag_run.get_task_instances(session=session):
            result["tasks"][ti.task_id] = {"state": str(ti.state), "try_number": ti.try_number}
        for row in session.query(XComModel).filter_by(dag_id=dag_id, run_id=dag_run.run_id):
            value = row.value
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            result["xcom"][f"{row.task_id}.{row.key}"] = value
    Path(result_file).write_text(json.dumps(result, default=str))
    return 0


class TaskRun:
    """One ``dag.test()`` of a fault DAG in a process of its own session (a task process to kill)."""

    def __init__(self, work: str, dag_id: str, logical_date: datetime, conf: dict, name: str) -> None:
        self.log_path = Path(work) / f"{name}.log"
        self.result_path = Path(work) / f"{name}.result.json"
        conf_path = Path(work) / f"{name}.conf.json"
        conf_path.write_text(json.dumps(conf))
        self.result_path.unlink(missing_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--dag-test", dag_id, logical_date.isoformat(), str(conf_path),
                 str(self.result_path)],
                cwd=ROOT, env=os.environ.copy(), start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
            )
        _children.append(self.process)
        self.started = time.monotonic()

    def wait(self, timeout_s: float = 600) -> dict:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the task process ran past {timeout_s} s; its log: {self.log_path}") from None
        self.ended = time.monotonic()
        if not self.result_path.exists():
            raise RuntimeError(f"the task process ended without a result; its log's end:\n{self.log()[-3000:]}")
        return json.loads(self.result_path.read_text())

    def kill(self) -> None:
        """SIGKILL the task process and everything in its process group: no handler, no on_kill()."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def stop_children() -> None:
    for process in _children:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


# -- the Ray side ----------------------------------------------------------------------------------


class Stack:
    """A fresh local 2-CPU Ray cluster, the ray_default connection pointing at it, an artifact root."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.artifact_root = os.path.join(work, "artifacts")
        self.temp_dir = tempfile.mkdtemp(prefix="bf", dir="/tmp")
        self.token = new_token()
        self.serve_port = free_port()
        self.clusters: list[LocalRayCluster] = []

    @property
    def cluster(self) -> LocalRayCluster:
        return self.clusters[-1]

    def start(self, dashboard_port: int = 0, gcs_port: int = 0) -> LocalRayCluster:
        cluster = LocalRayCluster(temp_dir=self.temp_dir, num_cpus=2, num_gpus=0, token=self.token,
                                  dashboard_port=dashboard_port, gcs_port=gcs_port)
        self.clusters.append(cluster)
        cluster.start()
        os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = json.dumps({"conn_type": "ray_ml", "extra": {
            "dashboard_url": cluster.dashboard_url, "auth_token": self.token, "artifact_root": self.artifact_root,
            "serve_url": f"http://127.0.0.1:{self.serve_port}"}})
        return cluster

    def stop(self) -> None:
        for cluster in self.clusters:
            cluster.stop()
        remove_temp_dir(self.temp_dir)

    def hook(self):
        from airflow_ray_ml.hooks.ray import RayHook

        return RayHook(timeout_s=120)  # the dashboard answers slowly on a 2-CPU machine under full load

    def submit(self, stage: str, spec: dict, submission_id: str | None = None) -> str:
        from airflow_ray_ml.ray_job import RAYML_PACKAGE_DIR
        from airflow_ray_ml_stages.constants import JOB_ENV_VARS

        submission_id = submission_id or f"bench-{stage}-{time.time_ns()}"
        self.hook().submit_job(entrypoint=f"python -m airflow_ray_ml_stages.{stage} --spec '{json.dumps(spec)}'",
                               submission_id=submission_id,
                               runtime_env={"py_modules": [RAYML_PACKAGE_DIR], "env_vars": dict(JOB_ENV_VARS)})
        return submission_id

    def run_stage(self, stage: str, spec: dict) -> dict:
        from airflow_ray_ml.ray_job import manifest_from_log

        hook = self.hook()
        submission_id = self.submit(stage, spec)
        while not hook.get_job_status(submission_id).is_terminal():
            time.sleep(0.5)
        manifest = manifest_from_log(hook.get_job_logs(submission_id))
        if not manifest or manifest["status"] != "succeeded":
            raise RuntimeError(f"stage {stage} failed: {hook.get_job_logs(submission_id)[-2000:]}")
        return manifest

    def prepared_data(self) -> dict:
        """Generated wine data, preprocessed: the preprocess task's XCom the fault DAGs take as conf['data']."""
        data = self.run_stage("generate", {"artifact_dir": f"{self.work}/data", "rows": DATA_ROWS, "seed": 1})
        return self.run_stage("data", {"artifact_dir": f"{self.work}/prep", "source": data["data_uris"],
                                       "label_column": "quality", "label_range": [0, 10]})

    def jobs_of(self, dag_id: str, task_id: str) -> list[dict]:
        return [job for job in self.hook().list_jobs()
                if (job.get("metadata") or {}).get("airflow_dag_id") == dag_id
                and (job.get("metadata") or {}).get("airflow_task_id") == task_id]

    def wait_for_running_job(self, dag_id: str, task_id: str, task: TaskRun, timeout_s: float = 180) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            jobs = [job for job in self.jobs_of(dag_id, task_id) if job["status"] == "RUNNING"]
            if jobs:
                return jobs[0]
            if task.process.poll() is not None:
                raise RuntimeError(f"the task process ended before its job ran; its log's end:\n{task.log()[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"no RUNNING job of {dag_id}.{task_id} within {timeout_s} s")


def train_spec(work: str, name: str, prep: dict, config: dict, **extra) -> dict:
    return {"artifact_dir": f"{work}/{name}", "train_uri": prep["split_uris"]["train"],
            "validation_uri": prep["split_uris"]["validation"], "test_uri": prep["split_uris"]["test"],
            "feature_columns": prep["feature_columns"], "label_column": prep["label_column"],
            "preprocessor_uri": prep["preprocessor_uri"], "data_fingerprint": prep["fingerprint"], "config": config,
            **extra}


def logical_date(index: int) -> datetime:
    return BASE_DATE + timedelta(hours=index)


def wait_for_file(pattern: str, timeout_s: float, task: TaskRun | None = None) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = glob.glob(pattern)
        if found:
            return found[0]
        if task is not None and task.process.poll() is not None:
            raise RuntimeError(f"the task process ended first; its log's end:\n{task.log()[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"nothing matched {pattern} within {timeout_s} s")


# -- 1. a promotion under load ---------------------------------------------------------------------


class Clients:
    """``count`` threads that POST /predict back to back; every answer's time, outcome and version."""

    def __init__(self, url: str, count: int) -> None:
        frame = wine.generate(rows=ROWS_PER_REQUEST * 10, seed=5).drop(columns=[wine.LABEL])
        self.body = {"instances": frame.head(ROWS_PER_REQUEST).to_dict(orient="records")}
        self.url = url
        self.answers: list[tuple[float, bool, str]] = []  # (wall-clock time, ok, version or error)
        self.stop_event = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(count)]

    def _loop(self) -> None:
        session = requests.Session()
        while not self.stop_event.is_set():
            try:
                reply = session.post(self.url, json=self.body, timeout=30)
                ok = reply.status_code == 200
                what = reply.json().get("model_version", "") if ok else f"HTTP {reply.status_code}"
            except (requests.RequestException, ValueError) as err:
                ok, what = False, type(err).__name__
            self.answers.append((time.time(), ok, what))

    def start(self) -> None:
        self.started = time.time()
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def window(self, start: float, end: float) -> dict:
        """Requests, failures and the longest gap between successful answers within [start, end]."""
        inside = [answer for answer in self.answers if start <= answer[0] <= end]
        ok_times = [start] + sorted(t for t, ok, _ in inside if ok) + [end]
        versions: dict[str, int] = {}
        for _, ok, what in inside:
            if ok:
                versions[what] = versions.get(what, 0) + 1
        failures = [what for _, ok, what in inside if not ok]
        return {"requests": len(inside), "failures": len(failures), "failure_kinds": sorted(set(failures)),
                "max_gap_s": max(b - a for a, b in zip(ok_times, ok_times[1:])), "versions": versions,
                "seconds": end - start}


def _log_time(log: str, marker: str) -> float:
    """The wall-clock time of the first task-log line holding ``marker`` (lines start with an ISO time)."""
    for line in log.splitlines():
        if marker in line:
            return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
    raise RuntimeError(f"no {marker!r} line in the task's log")


def _running_replicas(stack: Stack) -> int:
    apps = stack.hook().get_serve_applications().get("applications") or {}
    deployments = (apps.get("fault-wine") or {}).get("deployments") or {}
    return sum(1 for deployment in deployments.values() for replica in deployment.get("replicas") or []
               if replica.get("state") == "RUNNING")


def _promote(stack: Stack, work: str, clients: Clients, conf: dict, index: int, training: str | None = None) -> dict:
    """Promote conf['model'] while the clients run: the figures of the deploy task's run (from its
    start to its end, as its log says) and of the load before it (its process starting)."""
    called = time.time()
    task = TaskRun(work, "fault_deploy", logical_date(index), conf, f"deploy-{index}")
    result = task.wait()
    time.sleep(1.0)  # the last answers of the new version
    training_status = None
    if training:  # still training when the promotion was over?
        status = stack.hook().get_job_status(training)
        training_status = status.value if status else "missing"
    log = task.log()
    began, ended = _log_time(log, "Task started"), _log_time(log, "[DAG TEST] end task")
    return {"result": result, "during": clients.window(began, ended), "before": clients.window(called, began),
            "training_status": training_status,
            "last_version": next((what for _, ok, what in reversed(clients.answers) if ok), None)}


def fault_promotion(stack: Stack, prep: dict, work: str, args) -> list[dict]:
    from airflow_ray_ml.hooks.ray import SERVE_APPLICATIONS_ENDPOINT

    models = {name: stack.run_stage("train", train_spec(work, f"model-{name}", prep, config, num_workers=0))
              for name, config in MODELS.items()}
    first = TaskRun(work, "fault_deploy", logical_date(0), {"model": models["worse"], "data": prep}, "deploy-0")
    result = first.wait()
    if result["state"] != "success":
        raise RuntimeError(f"the first deploy failed; its log's end:\n{first.log()[-3000:]}")
    clients = Clients(f"http://127.0.0.1:{stack.serve_port}/fault-wine/predict", args.clients)
    rows = []
    training = None
    try:
        clients.start()
        # Serve's autoscaler answers the load with its second replica (max_replicas 2): the promotions
        # are measured against that steady state, not against a replica being added
        deadline = time.monotonic() + 120
        while _running_replicas(stack) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        replicas = _running_replicas(stack)
        print(f"[promotion] {replicas} replica(s) RUNNING {time.time() - clients.started:.0f} s after the "
              "clients started", flush=True)
        time.sleep(3)
        quiet = _promote(stack, work, clients, {"model": models["good"], "data": prep}, 1)
        rows.append(_promotion_row(f"a promotion under {args.clients} concurrent clients", quiet,
                                   models["good"]["model_version"]))
        # a training job (the train stage, local mode, in the job's process) on the same 2 CPUs
        training = stack.submit("train", train_spec(work, "busy-train", prep, {
            "family": "lightning", "hidden_sizes": [64, 32], "max_epochs": 1000, "patience": 0}, num_workers=0))
        wait_for_file(f"{work}/busy-train/workers/rank0-pid*.json", 120)  # its loop is training
        busy = _promote(stack, work, clients, {"model": models["better"], "data": prep}, 2, training=training)
        rows.append(_promotion_row("the same while a training job shares the 2 CPUs", busy,
                                   models["better"]["model_version"]))
    finally:
        clients.stop()
        # the training job stopped and Serve shut down (its replicas reserve CPUs), for the faults that
        # follow on this cluster; a slow answer here costs no measured figure
        try:
            if training:
                stack.hook().stop_job(training)
            stack.hook().request("DELETE", SERVE_APPLICATIONS_ENDPOINT)
        except Exception as err:  # noqa: BLE001
            print(f"[promotion] clean-up: {err}", flush=True)
    return rows


def _promotion_row(name: str, promoted: dict, new_version: str) -> dict:
    during, before = promoted["during"], promoted["before"]
    action = promoted["result"]["xcom"].get("deploy.action")
    state = promoted["result"]["state"]
    met = during["failures"] == 0 and during["max_gap_s"] <= GAP_GOAL_S and state == "success" \
        and promoted["last_version"] == new_version
    result = (f"{during['requests']:,} requests in {during['seconds']:.1f} s, {during['failures']} failed"
              f"{' (' + ', '.join(during['failure_kinds']) + ')' if during['failures'] else ''}; "
              f"longest gap {during['max_gap_s']:.3f} s (before the promotion: {before['max_gap_s']:.3f} s over "
              f"{before['seconds']:.0f} s); deploy task {state}, {action}; answers by version "
              f"{'/'.join(str(n) for n in during['versions'].values())}, last {'new' if promoted['last_version'] == new_version else 'old'}")
    if promoted["training_status"]:
        result += f"; training job {promoted['training_status']} at the end"
    return {"fault": name, "measured": "requests, failures, longest time without a successful answer while the "
            "deploy task ran (its log's start to end)",
            "result": result, "goal": f"0 failures, gap <= {GAP_GOAL_S} s", "met": met}


# -- 2. the task process SIGKILLed mid-job ---------------------------------------------------------


def _kill_task_mid_job(stack: Stack, work: str, dag_id: str, task_id: str, conf: dict, index: int, settle) -> dict:
    from airflow_ray_ml.job_status import base_submission_id

    first = TaskRun(work, dag_id, logical_date(index), conf, f"{dag_id}-try1")
    try:
        job = stack.wait_for_running_job(dag_id, task_id, first)
        settle(first)
    finally:
        first.kill()
    killed_at = time.time()
    status_at_retry = stack.hook().get_job_status(job["submission_id"])
    retry = TaskRun(work, dag_id, logical_date(index), conf, f"{dag_id}-try2")
    result = retry.wait()
    log = retry.log()
    decisions = re.findall(rf"Ray job ({re.escape(job['submission_id'])}\S*): (submit|attach|reuse);", log)
    decided_after = _log_time(log, f"Ray job {decisions[0][0]}: {decisions[0][1]};") - killed_at if decisions else None
    jobs = stack.jobs_of(dag_id, task_id)
    return {"ids": sorted(j["submission_id"] for j in jobs), "base": base_submission_id(dag_id, result["run_id"], task_id),
            "status_at_retry": status_at_retry.value if status_at_retry else "missing",
            "decision": decisions[0][1] if decisions else "not logged", "decided_after_s": decided_after,
            "state": result["state"], "job_status": {j["submission_id"]: j["status"] for j in jobs}}


def fault_kill_task(stack: Stack, prep: dict, work: str, args) -> list[dict]:
    rows = []
    # xgboost trials to their end, 1 CPU each, two at a time: the search outlasts the kill and the
    # retry's start (a task process takes 10-25 s from its start to its decision on this machine)
    tune_conf = {"data": prep, "num_samples": 4, "search_space": {
        "family": "xgboost", "scaler": "standard",
        "xgboost": {"max_depth": {"randint": [4, 9]}, "eta": {"loguniform": [0.02, 0.1]},
                    "num_boost_round": 4000, "early_stopping_rounds": 0}}}
    tuned = _kill_task_mid_job(stack, work, "fault_tune", "tune", tune_conf, 10, settle=lambda task: time.sleep(5))
    rows.append(_kill_task_row("the Airflow task SIGKILLed mid-tune (RayTuneOperator)", tuned))
    train_conf = {"data": prep, "config": {"family": "lightning", "hidden_sizes": [64, 32], "max_epochs": 200,
                                           "patience": 0}}

    def training_started(task: TaskRun) -> None:  # the loop has announced its worker: mid-training
        wait_for_file(f"{stack.artifact_root}/fault_train/*/train/workers/rank0-pid*.json", 120, task)
        time.sleep(1)

    trained = _kill_task_mid_job(stack, work, "fault_train", "train", train_conf, 11, settle=training_started)
    rows.append(_kill_task_row("the Airflow task SIGKILLed mid-train (RayTrainOperator)", trained))
    return rows


def _kill_task_row(name: str, found: dict) -> dict:
    one = found["ids"] == [found["base"]]
    met = one and found["status_at_retry"] == "RUNNING" and found["decision"] == "attach" and found["state"] == "success"
    jobs = ", ".join(f"{'its own id' if i == found['base'] else i} {s}" for i, s in found["job_status"].items())
    decided = "" if found["decided_after_s"] is None else f" {found['decided_after_s']:.0f} s after the kill"
    result = (f"{len(found['ids'])} Ray job(s) for the task run ({jobs}); RUNNING when the retry's process started; "
              f"the retry's decision{decided}: {found['decision']}; DAG run {found['state']}")
    if found["status_at_retry"] != "RUNNING":
        result = result.replace("RUNNING when", f"{found['status_at_retry']} when")
    return {"fault": name, "measured": "Ray jobs started for the task run; did the retry re-attach",
            "result": result, "goal": "1 job; re-attached to the RUNNING job", "met": met}


# -- 3. a Ray Train worker SIGKILLed ----------------------------------------------------------------


def _registered_checkpoint(run_dir: str) -> dict | None:
    """The latest checkpoint Ray Train's controller has registered for this run (its reported metrics)."""
    for snapshot in glob.glob(os.path.join(run_dir, "train_runs", "*", "checkpoint_manager_snapshot.json")):
        try:
            latest = json.loads(Path(snapshot).read_text()).get("latest_checkpoint_result")
        except (OSError, json.JSONDecodeError):  # being written
            continue
        if latest:
            return latest
    return None


def fault_kill_worker(stack: Stack, prep: dict, work: str, args) -> list[dict]:
    epochs = 12
    conf = {"data": prep, "config": {"family": "lightning", "hidden_sizes": [32, 16], "max_epochs": epochs,
                                     "patience": 0}}
    task = TaskRun(work, "fault_train_worker", logical_date(20), conf, "train-worker")
    killed, checkpoint = None, None
    try:
        deadline = time.monotonic() + 300
        while killed is None and time.monotonic() < deadline and task.process.poll() is None:
            for run_dir in glob.glob(f"{stack.artifact_root}/fault_train_worker/*/train"):
                pids = glob.glob(os.path.join(run_dir, "workers", "rank0-pid*.json"))
                checkpoint = _registered_checkpoint(run_dir)
                # a few checkpoints in (a third of the epochs), so a resume from the first would show
                if pids and checkpoint and (checkpoint.get("metrics") or {}).get("epoch", -1) + 1 >= epochs // 3:
                    killed = json.loads(Path(pids[0]).read_text())["pid"]
                    os.kill(killed, signal.SIGKILL)
                    break
            time.sleep(0.05)
        result = task.wait()
    finally:
        task.kill()
    if killed is None:
        raise RuntimeError(f"no worker with a registered checkpoint was seen; the task's log:\n{task.log()[-3000:]}")
    manifest = result["xcom"].get("train.return_value") or {}
    training = manifest.get("training") or {}
    metrics = (checkpoint or {}).get("metrics") or {}
    last_epoch = metrics.get("epoch")
    last_done = None if last_epoch is None else int(last_epoch) + 1  # Lightning's epoch index, 0-based
    resumed = training.get("resumed_from_epoch")
    met = (result["state"] == "success" and (training.get("restarts") or 0) >= 1 and resumed is not None
           and last_done is not None and resumed >= last_done and training.get("epochs_run") == epochs)
    text = (f"worker pid {killed} killed after the checkpoint of epoch {last_done if last_done is not None else '?'} "
            f"of {epochs} was registered; restarts {training.get('restarts')}, worker starts "
            f"{training.get('worker_starts')}, resumed_from_epoch {resumed}, epochs run "
            f"{training.get('epochs_run')}; task {result['tasks'].get('train', {}).get('state')}")
    return [{"fault": "a Ray Train worker SIGKILLed mid-training (1 worker, checkpoint every epoch)",
             "measured": "restarts, the epoch it resumed from, the task's end",
             "result": text, "goal": "resumed from the last checkpoint; task succeeded", "met": met}]


# -- 4. the head stopped mid-run --------------------------------------------------------------------


def task_state(dag_id: str, task_id: str) -> tuple[str | None, int | None]:
    """The state and try number of the task's latest run, read straight from the metadata DB."""
    path = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        row = db.execute("SELECT state, try_number FROM task_instance WHERE dag_id = ? AND task_id = ? "
                         "ORDER BY start_date DESC LIMIT 1", (dag_id, task_id)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def fault_head(stack: Stack, prep: dict, work: str, args) -> list[dict]:
    first = stack.cluster
    # long enough that the job is still training when the head is gone (stopping takes seconds)
    conf = {"data": prep, "config": {"family": "lightning", "hidden_sizes": [64, 32], "max_epochs": 100,
                                     "patience": 0}}
    task = TaskRun(work, "fault_head", logical_date(30), conf, "head")
    try:
        stack.wait_for_running_job("fault_head", "train", task)
        wait_for_file(f"{stack.artifact_root}/fault_head/*/train/workers/rank0-pid*.json", 120, task)
        stopping = time.monotonic()
        first.stop()  # the head and everything of its session; the task process is left as it is
        stopped_s = time.monotonic() - stopping
        # the task's first try fails (up for retry); then a new cluster on the same ports, same token
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and task.process.poll() is None:
            state, try_number = task_state("fault_head", "train")
            if state == "up_for_retry":
                break
            time.sleep(0.2)
        failed_after = time.monotonic() - stopping
        stack.start(dashboard_port=first.dashboard_port, gcs_port=first.gcs_port)
        restarted_after = time.monotonic() - stopping
        result = task.wait()
    finally:
        task.kill()
    log = task.log()
    expected = f"Cannot reach the Ray cluster at {first.dashboard_url}"
    # the exception the first try failed with (the traceback's last line), not the lost-stream warning
    error_lines = [line for line in log.splitlines() if "RayClusterUnreachableError: " in line]
    matched = any(f"RayClusterUnreachableError: {expected}" in line for line in error_lines)
    try_number = result["tasks"].get("train", {}).get("try_number")
    succeeded = result["state"] == "success" and (try_number or 0) >= 2
    text = (f"the stop took {stopped_s:.1f} s; first try up for retry {failed_after:.1f} s after the stop began"
            f" ({'its error names the unreachable cluster' if matched else 'no unreachable-cluster error in its log'}"
            f"{': ' + _short(error_lines[-1]) if error_lines else ''}); new cluster up {restarted_after:.1f} s "
            f"after it; retry on it: {'succeeded' if succeeded else 'did not succeed'} (try {try_number}, "
            f"DAG run {result['state']})")
    return [{"fault": "the Ray head stopped mid-run (train job running)",
             "measured": "the task's error; the retry on a new cluster on the same ports",
             "result": text, "goal": "error says unreachable; retry succeeds", "met": matched and succeeded}]


def _short(line: str) -> str:
    index = line.find("Cannot reach")
    # cut to fit a table cell; backticks would open code spans there
    return (line[index:] if index >= 0 else line.strip())[:110].replace("`", "'") + "..."


# -- the table --------------------------------------------------------------------------------------


def print_table(rows: list[dict], took_s: float) -> None:
    print("\n| fault | measured | result | goal | met |")
    print("|---|---|---|---|---|")
    for row in rows:
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        print(f"| {row['fault']} | {row['measured']} | {row['result']} | {row['goal']} | {met} |")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\n{len(rows)} row(s) in {took_s:.0f} s; load average at the end {load} ({os.cpu_count()} CPUs)")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--dag-test":  # a task process started by this bench
        return dag_test_main(*sys.argv[2:6])
    interrupt_on_termination()  # a timeout's SIGTERM still runs the finally blocks that stop the clusters
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=FAULTS, action="append", help="run only this fault (repeatable)")
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    started = time.monotonic()
    work_root = tempfile.mkdtemp(prefix="bench-faults-")
    airflow_env(os.path.join(work_root, "airflow"))
    runners = {"promotion": fault_promotion, "kill_task": fault_kill_task, "kill_worker": fault_kill_worker,
               "head": fault_head}
    # one cluster and one data set for every fault (the head fault replaces the cluster, so it runs last)
    selected = [name for name in FAULTS if name in (args.only or FAULTS)]
    rows: list[dict] = []
    stack = Stack(work_root)
    try:
        stack.start()
        prep = stack.prepared_data()
        print(f"cluster up and data prepared in {time.monotonic() - started:.0f} s; logs in {work_root}", flush=True)
        for name in selected:
            work = os.path.join(work_root, name)
            os.makedirs(work)
            fault_started = time.monotonic()
            try:
                found = runners[name](stack, prep, work, args)
            except KeyboardInterrupt:
                raise
            except Exception as err:  # one fault's failure is reported, the others still run
                found = [{"fault": name, "measured": "-", "result": f"the bench could not make this fault: "
                          f"{type(err).__name__}: {str(err)[:300]}".replace("\n", " "), "goal": "-", "met": None}]
            finally:
                stop_children()
            print(f"[{name}] {time.monotonic() - fault_started:.0f} s: "
                  + "; ".join(f"{row['result']}" for row in found), flush=True)
            rows.extend(found)
    finally:
        stop_children()
        stack.stop()
    print_table(rows, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
