"""The embedded stack behind `make run` and `make stop`: a local Ray head and Airflow's components.

    python scripts/stack.py up        start Ray and Airflow unless already running (PID files)
    python scripts/stack.py trigger   unpause and trigger the wine DAG over the REST API, follow it
    python scripts/stack.py down      stop exactly what `up` started (by session, never by name)
    python scripts/stack.py airflow   (what `up` starts) Airflow's database migration, then its
                                      components, until a SIGINT stops them

Everything lives in the project (AIRFLOW_HOME in .airflow/; PID files, logs and the Ray auth token
in .run/; artifacts in artifacts/) except Ray's temp dir, which socket-path limits keep short: a
private dir under the system temp dir, printed by `up`, removed by `down`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from scripts import localcluster  # noqa: E402
from airflow_ray_ml_stages import wine  # noqa: E402
from airflow_ray_ml_stages.constants import TUNE_PROGRESS_MARKER  # noqa: E402

RUN_DIR = ROOT / ".run"
AIRFLOW_HOME = ROOT / ".airflow"
RAY_PID_FILE = RUN_DIR / "ray.json"
AIRFLOW_PID_FILE = RUN_DIR / "airflow.json"
TOKEN_FILE = RUN_DIR / "ray_auth_token"
PASSWORD_FILE = AIRFLOW_HOME / "simple_auth_manager_passwords.json.generated"
RAY_DASHBOARD_PORT = int(os.environ.get("RAY_DASHBOARD_PORT", "8265"))
AIRFLOW_PORT = int(os.environ.get("AIRFLOW_PORT", "8080"))
AIRFLOW_URL = f"http://127.0.0.1:{AIRFLOW_PORT}"
DAG_ID = os.environ.get("DAG_ID", "wine_quality_pipeline")
SCORING_DAG_ID = "wine_batch_scoring"  # scheduled on the model Asset that DAG_ID's deploy updates


# What `airflow standalone` runs, without the log servers that the scheduler (for its LocalExecutor's
# tasks, 8793) and the triggerer (8794) would start on every interface (Airflow binds them to all of
# them): the api-server reads task logs from the files they write on this machine.
AIRFLOW_COMPONENTS = (["api-server"], ["scheduler", "--skip-serve-logs"], ["dag-processor"],
                      ["triggerer", "--skip-serve-logs"])


def airflow_env() -> dict[str, str]:
    """The environment Airflow's components run with: project-local, loopback-only, low parallelism."""
    venv_bin = os.path.dirname(sys.executable)
    return {
        **os.environ,
        "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
        # No PYTHONPATH: `make install` installed the project, and the *.egg-info that its editable
        # build leaves in include/ would show Airflow the package twice, which registers the "Ray ML"
        # plugin twice ("Plugin 'ray_ml' already registered" on every home page).
        "PYTHONPATH": "",
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(AIRFLOW_PORT),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{AIRFLOW_URL}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # ray_default lives in Airflow's database (keep_ray_connection), not in an AIRFLOW_CONN_ variable:
        # a variable would be fixed until a restart, and would hide the database's copy
        "RAY_AUTH_TOKEN_PATH": str(TOKEN_FILE),  # the hook reads the token from here
        "RAYML_ARTIFACT_ROOT": str(ROOT / "artifacts"),
        # the demo's only run is the one `make run` triggers (see dags/wine_quality_pipeline.py)
        "WINE_PIPELINE_SCHEDULE": os.environ.get("WINE_PIPELINE_SCHEDULE", "none"),
    }


def _state(pid_file: Path) -> dict | None:
    try:
        return json.loads(pid_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _alive(pid_file: Path) -> bool:
    state = _state(pid_file)
    return bool(state) and bool(localcluster.session_pids(int(state["pid"])))


def _wait_http(url: str, timeout_s: float, what: str, pid_file: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code < 500:
                return
        except requests.RequestException:
            pass
        if not _alive(pid_file):
            raise SystemExit(f"{what} exited during start-up; see {RUN_DIR / 'airflow.log'}")
        time.sleep(1)
    raise SystemExit(f"{what} did not answer at {url} within {timeout_s:.0f} s; see {RUN_DIR}")


def cluster_size(cpus: str, gpus: str) -> list[str]:
    """``make run RAY_CPUS= RAY_GPUS=`` as the local head's arguments (empty: what Ray detects)."""
    size = []
    for name, value, flag in (("RAY_CPUS", cpus, "--num-cpus"), ("RAY_GPUS", gpus, "--num-gpus")):
        value = value.strip()
        if not value:
            continue
        if not value.isdigit() or (name == "RAY_CPUS" and int(value) == 0):
            raise SystemExit(f"{name}={value!r}: give the number of {name[4:]}s the local Ray head advertises, a whole "
                             f"number{' of at least 1' if name == 'RAY_CPUS' else ''}, or leave it empty for what Ray "
                             "detects")
        size += [flag, value]
    return size


def up(size: list[str] | None = None) -> None:
    RUN_DIR.mkdir(exist_ok=True)
    (ROOT / "artifacts").mkdir(exist_ok=True)
    if size and _alive(RAY_PID_FILE):
        print("RAY_CPUS and RAY_GPUS take effect when the local Ray cluster starts: it is already running, so "
              "`make stop` first to change its size")
    code = localcluster.main([
        "start", "--pid-file", str(RAY_PID_FILE),
        "--dashboard-port", str(RAY_DASHBOARD_PORT), "--token-file", str(TOKEN_FILE), *(size or []),
    ])
    if code:
        raise SystemExit(code)
    if _alive(AIRFLOW_PID_FILE):
        print(f"airflow is already running at {AIRFLOW_URL} (PID {_state(AIRFLOW_PID_FILE)['pid']})")
        return
    try:
        requests.get(f"{AIRFLOW_URL}/api/v2/monitor/health", timeout=2)
        raise SystemExit(f"port {AIRFLOW_PORT} is taken by a process this project did not start; "
                         "stop it or choose another port with AIRFLOW_PORT")
    except requests.RequestException:
        pass
    AIRFLOW_HOME.mkdir(exist_ok=True)
    with open(RUN_DIR / "airflow.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "airflow"],
            cwd=ROOT, env=airflow_env(), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    AIRFLOW_PID_FILE.write_text(json.dumps({"pid": process.pid, "url": AIRFLOW_URL}))
    print(f"starting airflow: {', '.join(args[0] for args in AIRFLOW_COMPONENTS)} (PID {process.pid}); "
          f"log in {RUN_DIR / 'airflow.log'}")
    _wait_http(f"{AIRFLOW_URL}/api/v2/monitor/health", 240, "airflow", AIRFLOW_PID_FILE)
    print(f"airflow is up at {AIRFLOW_URL}")


def run_airflow() -> int:
    """Migrate Airflow's database, then run ``AIRFLOW_COMPONENTS`` until a SIGINT (or SIGTERM), which
    each of them gets in turn, as `airflow standalone` does; `up` starts this as its session's leader."""
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    migrated = subprocess.run([airflow, "db", "migrate"], stdin=subprocess.DEVNULL)
    if migrated.returncode:
        return migrated.returncode
    components = [subprocess.Popen([airflow, *args], stdin=subprocess.DEVNULL) for args in AIRFLOW_COMPONENTS]

    def stop(signum: int, _frame: object) -> None:
        for component in components:
            if component.poll() is None:
                component.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for component in components:
        component.wait()
    return 0


def down() -> None:
    state = _state(AIRFLOW_PID_FILE)
    if state and localcluster.session_pids(int(state["pid"])):
        # run_airflow hands the SIGINT on to each component, which shuts down cleanly on it
        killed = localcluster.stop_session(int(state["pid"]), grace_s=30, sig=signal.SIGINT)
        print(f"stopped airflow (PID {state['pid']}; {killed} process(es) needed SIGKILL)")
    else:
        print("no airflow of ours is running")
    AIRFLOW_PID_FILE.unlink(missing_ok=True)
    localcluster.main(["stop", "--pid-file", str(RAY_PID_FILE)])


READ_ATTEMPTS = 5  # tries of one REST read before `make run` gives up following the run


class AirflowClient:
    """The few Airflow REST API calls `make run` needs, as the admin user of the simple auth manager."""

    def __init__(self) -> None:
        self.session = requests.Session()

    def login(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not PASSWORD_FILE.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{PASSWORD_FILE} was not written; is airflow's api-server running?")
            time.sleep(1)
        username, password = next(iter(json.loads(PASSWORD_FILE.read_text()).items()))
        response = requests.post(f"{AIRFLOW_URL}/auth/token", json={"username": username, "password": password},
                                 timeout=30)
        response.raise_for_status()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def call(self, method: str, path: str, **kwargs) -> dict:
        # A busy machine can stall the api-server for a while: a read (GET) is asked again, a few
        # times, rather than abandoning a run that goes on in Airflow.
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                response = self.session.request(method, f"{AIRFLOW_URL}/api/v2{path}", timeout=30, **kwargs)
                break
            except (requests.Timeout, requests.ConnectionError) as err:
                if method != "GET" or attempt == READ_ATTEMPTS:
                    raise SystemExit(f"{method} {path}: Airflow did not answer ({err}); the run goes on in "
                                     f"Airflow: see {AIRFLOW_URL}") from None
                print(f"  (Airflow did not answer {path} within 30 s; asking again)")
                time.sleep(5 * attempt)
        if response.status_code >= 400:
            raise SystemExit(f"{method} {path} answered HTTP {response.status_code}: {response.text[:500]}")
        return response.json()

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = self.session.get(f"{AIRFLOW_URL}/api/v2/dags/{dag_id}", timeout=30)
            if response.status_code == 200:
                return
            time.sleep(2)
        errors = self.call("GET", "/importErrors")
        raise SystemExit(f"DAG {dag_id} was not parsed within {timeout_s:.0f} s; import errors: {errors}")


RAY_CONN_ID = "ray_default"


def ray_connection_extra(current: dict, sources: list[str]) -> dict:
    """The ``ray_default`` extra for this stack: the embedded cluster, the project's artifact root, and
    ``allowed_sources`` widened by ``sources`` (what ``SOURCE=`` gave). What else ``current`` holds stays:
    settings a person added in the UI, and the sources earlier runs were given, so those runs can be
    triggered again from the form."""
    from airflow_ray_ml.confine import parse_setting

    allowed = list(dict.fromkeys([*parse_setting(current.get("allowed_sources")), *sources]))
    return {**current, "dashboard_url": f"http://127.0.0.1:{RAY_DASHBOARD_PORT}",
            "artifact_root": str(ROOT / "artifacts"), "verify_tls": True, "allowed_sources": allowed}


def keep_ray_connection(client: AirflowClient, sources: list[str]) -> None:
    """Create or update ``ray_default`` in Airflow's database through the REST API, allowing ``sources``.

    The connection is read where each task runs, so a ``make run SOURCE=...`` on a running stack
    allows its files from this run on (airflow_ray_ml.confine refuses a conf's files elsewhere).
    """
    response = client.session.get(f"{AIRFLOW_URL}/api/v2/connections/{RAY_CONN_ID}", timeout=30)
    if response.status_code not in (200, 404):
        raise SystemExit(f"GET /connections/{RAY_CONN_ID} answered HTTP {response.status_code}: {response.text[:500]}")
    # sensitive values come back as '***'; Airflow keeps the stored ones for them when they are sent back
    current = json.loads(response.json().get("extra") or "{}") if response.status_code == 200 else {}
    body = {"connection_id": RAY_CONN_ID, "conn_type": "ray_ml",
            "extra": json.dumps(ray_connection_extra(current, sources))}
    if response.status_code == 404:
        client.call("POST", "/connections", json=body)
    else:
        client.call("PATCH", f"/connections/{RAY_CONN_ID}", json=body)
    if sources:
        print(f"allowed sources of {RAY_CONN_ID} now include {', '.join(sources)}")


def _param_default(params: dict, name: str):
    """A Param's default as the DAG details of the REST API give it (the DAG says it once)."""
    param = params.get(name)
    return param.get("value") if isinstance(param, dict) else param


def _seconds(ti: dict) -> str:
    return f"{ti['duration']:.1f}" if ti.get("duration") is not None else "-"


def trigger(conf: dict, timeout_s: float, sources: list[str] = ()) -> int:
    """Trigger the DAG with ``conf`` and follow the run; ``sources`` (SOURCE='s files) are allowed first."""
    client = AirflowClient()
    client.login()
    keep_ray_connection(client, list(sources))
    client.wait_for_dag(DAG_ID)
    default_label = _param_default(client.call("GET", f"/dags/{DAG_ID}/details").get("params") or {}, "label_column")
    check_label(conf, default_label)
    report_runs_from_before(client)
    client.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    scoring = _unpause_scoring(client)
    run = client.call("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    run_id = run["dag_run_id"]
    print(f"triggered {DAG_ID} run {run_id}")
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str] = {}
    progress = Progress()
    while True:
        run = client.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
        tis = client.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        for ti in tis:
            if seen.get(ti["task_id"]) != ti["state"]:
                seen[ti["task_id"]] = ti["state"]
                print(f"  {ti['task_id']}: {ti['state']}")
                if ti["state"] == "awaiting_input" or (ti["state"] == "deferred" and conf.get("approval")):
                    print(f"    waiting for a person's answer: Approve or Reject it under Required Actions, "
                          f"{AIRFLOW_URL}/required_actions")
            if ti["task_id"] == "tune" and ti["state"] in ("running", "deferred"):
                progress.report(client, run_id, ti)
        if run["state"] in ("success", "failed"):
            break
        if time.monotonic() > deadline:
            print(f"the run did not finish within {timeout_s:.0f} s; it goes on in Airflow")
            break
        time.sleep(3)
    print(f"\nrun {run_id}: {run['state']}")
    print(f"{'task':<24} {'state':<16} {'seconds':>8}")
    for ti in sorted(tis, key=lambda ti: ti.get("start_date") or ""):
        print(f"{ti['task_id']:<24} {str(ti['state']):<16} {_seconds(ti):>8}")
    if run["state"] == "failed":
        report_failures(client, run_id, tis)
    if run["state"] == "success":
        report_model(client, run_id, conf.get("label_column") or default_label)
        if scoring and isinstance(_xcom(client, run_id, "deploy"), dict):
            report_scoring(client, run["start_date"], min(600.0, timeout_s))
    print(f"\nAirflow UI: {AIRFLOW_URL}  (user admin; password in {PASSWORD_FILE})")
    print(f"Ray dashboard: http://127.0.0.1:{RAY_DASHBOARD_PORT}  (token in {TOKEN_FILE})")
    print("The stack keeps running; `make stop` stops it.")
    return 0 if run["state"] == "success" else 1


def task_log_records(client: AirflowClient, run_id: str, task_id: str, attempt: int) -> list:
    """The records of one try's task log, as Airflow's log endpoint returns them ([] when it cannot)."""
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{attempt}"
    response = client.session.get(f"{AIRFLOW_URL}/api/v2{path}", params={"full_content": "true"},
                                  headers={"Accept": "application/json"}, timeout=30)
    content = response.json().get("content") if response.ok else None
    return content if isinstance(content, list) else []


def last_progress(records: list) -> str | None:
    """The last line of a search's progress (``TUNE_PROGRESS_MARKER``) among a task log's records."""
    found = None
    for record in records:
        event = record.get("event") if isinstance(record, dict) else record
        if isinstance(event, str) and TUNE_PROGRESS_MARKER in event:
            found = event[event.index(TUNE_PROGRESS_MARKER):].strip()
    return found


class Progress:
    """Repeats a running search's progress line from its task log, at most every ``EVERY_S``."""

    EVERY_S = 30.0

    def __init__(self) -> None:
        self.looked, self.said = 0.0, None

    def report(self, client: AirflowClient, run_id: str, ti: dict) -> None:
        if time.monotonic() - self.looked < self.EVERY_S:
            return
        self.looked = time.monotonic()
        line = last_progress(task_log_records(client, run_id, ti["task_id"], ti.get("try_number") or 1))
        if line and line != self.said:
            self.said = line
            print(f"    {line}")


def report_runs_from_before(client: AirflowClient) -> list[str]:
    """Say which runs of the pipeline are queued or running before `make run` triggers its own (a
    retraining drift started, resumed after `make stop`): one runs at a time, so this run waits for
    them, and each may change what is served when it ends. Returns their run ids."""
    runs = client.call("GET", f"/dags/{DAG_ID}/dagRuns",
                       params={"state": ["queued", "running"], "limit": 100})["dag_runs"]
    for run in runs:
        print(f"a {DAG_ID} run from before is {run['state']}: {run['dag_run_id']}"
              + (f" ({run['note']})" if run.get("note") else "")
              + "; it may change what is served when it ends, and this run starts after it")
    return [run["dag_run_id"] for run in runs]


def task_error(records: list) -> str | None:
    """The error a failed task's log ends with: its exception's type and message, else its last error line."""
    error = None
    for record in records:
        if not isinstance(record, dict):
            continue
        detail = record.get("error_detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            error = f"{detail[0].get('exc_type', 'Error')}: {detail[0].get('exc_value', '')}".strip()
        elif record.get("level") == "error" and record.get("event") and error is None:
            error = str(record["event"])
    return error


def report_failures(client: AirflowClient, run_id: str, tis: list[dict]) -> None:
    """Each failed task's error and where its whole log is: the UI page and the file."""
    for ti in sorted((ti for ti in tis if ti["state"] == "failed"), key=lambda ti: ti.get("start_date") or ""):
        task_id, attempt = ti["task_id"], ti.get("try_number") or 1
        error = task_error(task_log_records(client, run_id, task_id, attempt)) or "(no error in its log; see the log)"
        print(f"\n{task_id} failed (try {attempt}): {error}")
        print(f"  log: {AIRFLOW_URL}/dags/{DAG_ID}/runs/{run_id}/tasks/{task_id}?try_number={attempt}")
        log_file = AIRFLOW_HOME / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}" / \
            f"attempt={attempt}.log"
        if log_file.exists():
            print(f"  file: {log_file}")


def _unpause_scoring(client: AirflowClient) -> bool:
    """Unpause the batch-scoring DAG, so a promotion's Asset event starts it (False: not parsed)."""
    try:
        client.wait_for_dag(SCORING_DAG_ID, timeout_s=60)
    except SystemExit:
        return False
    client.call("PATCH", f"/dags/{SCORING_DAG_ID}", json={"is_paused": False})
    return True


def report_scoring(client: AirflowClient, after: str, timeout_s: float) -> None:
    """Wait for the scoring run the promotion's Asset event started; print where its predictions went."""
    print(f"\nthe promotion updated the model Asset: waiting for {SCORING_DAG_ID} ...")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = client.call("GET", f"/dags/{SCORING_DAG_ID}/dagRuns",
                           params={"order_by": "-run_after", "limit": 1})["dag_runs"]
        run = runs[0] if runs and (runs[0].get("run_after") or "") >= (after or "")[:19] else None
        if run and run["state"] in ("success", "failed"):
            scored = _xcom(client, run["dag_run_id"], "score", dag_id=SCORING_DAG_ID)
            skipped = _xcom(client, run["dag_run_id"], "pick_input", key="skip_reason", dag_id=SCORING_DAG_ID)
            if run["state"] == "success" and skipped:
                print(f"{SCORING_DAG_ID} run {run['dag_run_id']}: skipped the scoring: {skipped}")
            elif run["state"] == "success" and isinstance(scored, dict):
                drift = scored.get("drift") or {}
                print(f"{SCORING_DAG_ID} run {run['dag_run_id']}: scored {scored['rows']} new wines with "
                      f"{scored['model_version']}; predictions in {scored['output_uri']}"
                      + (f"; drift against the training data: {drift.get('reason') or drift['verdict']}"
                         if drift.get("verdict") else ""))
            else:
                print(f"{SCORING_DAG_ID} run {run['dag_run_id']}: {run['state']} (see its task logs in the UI)")
            retraining = _xcom(client, run["dag_run_id"], "retrain", key="trigger_run_id", dag_id=SCORING_DAG_ID)
            if retraining:  # it may replace the served model later: say so now
                print(f"the drift started a retraining: {DAG_ID} run {retraining}, with the Params of the run that "
                      "trained the served model; it goes on in Airflow and promotes only if it beats the served "
                      "model (its note says why it started; `make stop` leaves it to the next `make run`)")
            return
        time.sleep(3)
    print(f"{SCORING_DAG_ID} did not finish within {timeout_s:.0f} s; it goes on in Airflow")


def _xcom(client: AirflowClient, run_id: str, task_id: str, key: str = "return_value", dag_id: str = DAG_ID):
    response = client.session.get(
        f"{AIRFLOW_URL}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
        params={"deserialize": "true"}, timeout=30)
    if response.status_code != 200:
        return None
    value = response.json().get("value")
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


def report_leaderboard(client: AirflowClient, run_id: str, top: int = 5) -> None:
    """Print the first rows of the run's Tune leaderboard (best first)."""
    tuned = _xcom(client, run_id, "tune")
    if not isinstance(tuned, dict) or not tuned.get("leaderboard_json_uri"):
        return
    print_leaderboard(tuned, top)


def print_leaderboard(tuned: dict, top: int = 5) -> None:
    """Print the first ``top`` rows of the leaderboard a tune XCom names (an ensemble's row by its members)."""
    from airflow_ray_ml_stages import artifacts

    rows = artifacts.read_json(tuned["leaderboard_json_uri"])
    counts = tuned.get("trials", {})
    print(f"\ntune: {counts.get('total', len(rows))} trials ({counts.get('completed', '?')} completed, "
          f"{counts.get('early_stopped', '?')} stopped early by {tuned.get('scheduler')}, "
          f"{counts.get('failed', '?')} failed) in {tuned.get('time_s', float('nan')):.0f} s; top {top}:")
    from airflow_ray_ml_stages.metrics import TASK_METRICS, task_of_metric

    first, second = [f"val_{name}" for name in TASK_METRICS[task_of_metric(tuned["metric"])]][:2]
    print(f"{'rank':>4} {'family':<13} {'scaler':<9} {first:>12} {second:>12} {'status':<14} config")
    from airflow_ray_ml_stages.ensemble import describe_members

    for row in rows[:top]:
        metrics = row.get("metrics") or {}
        config = {k: v for k, v in (row.get("config") or {}).items() if k not in ("family", "scaler")}
        # an ensemble by its members' trials and weights (as the tune log and the page say it), not their configs
        text = (describe_members(config.get("members", [])) if row.get("family") == "ensemble"
                else json.dumps(config, sort_keys=True))
        print(f"{row.get('rank') or '':>4} {row.get('family') or '':<13} {row.get('scaler') or '-':<9} "
              f"{metrics.get(first, float('nan')):>12.4f} {metrics.get(second, float('nan')):>12.4f} "
              f"{row.get('status') or '':<14} {text[:90]}")
    print(f"leaderboard: {tuned['leaderboard_csv_uri']}\nplot: {tuned['plot_uri']}")


def model_summary(model: dict, label: str) -> str:
    """The trained model's test metrics (the train task's XCom) in one line, as fit its task and ``label``."""
    test, baseline = model["metrics"]["test"], model.get("baseline", {})
    if model.get("classes") is None:
        # the share within half a grade and a grade means something for wine grades only
        bands = (f", within 0.5: {test['acc_0_5']:.1%}, within 1.0: {test['acc_1_0']:.1%}"
                 if label == wine.LABEL else "")
        return (f"model {model.get('model_version')} ({model.get('family')}): test RMSE {test['rmse']:.4g}, "
                f"MAE {test['mae']:.4g}{bands} (mean-predictor RMSE {baseline.get('test_rmse', float('nan')):.4g})")
    return (f"model {model.get('model_version')} ({model.get('family')}), {len(model['classes'])} classes: "
            f"test log loss {test['log_loss']:.3f}, accuracy {test['accuracy']:.1%}, macro F1 "
            f"{test['macro_f1']:.3f} (class-shares baseline: log loss "
            f"{baseline.get('test_log_loss', float('nan')):.3f}, accuracy "
            f"{baseline.get('test_accuracy', float('nan')):.1%})")


def report_model(client: AirflowClient, run_id: str, label: str) -> None:
    """Print the trained model's test metrics (of ``label``), the endpoint, and one real prediction from it."""
    report_leaderboard(client, run_id)
    model = _xcom(client, run_id, "train")
    if isinstance(model, dict) and model.get("metrics"):
        print("\n" + model_summary(model, label))
    deployed = _xcom(client, run_id, "deploy")
    decision = _xcom(client, run_id, "deploy", key="decision")
    endpoint = _xcom(client, run_id, "deploy", key="serve_endpoint")
    if isinstance(deployed, dict):
        print(f"deploy: promoted {deployed['model_version']} ({deployed['reason']})")
    elif isinstance(decision, dict):
        print(f"deploy: kept champion {decision.get('champion_version')} ({decision.get('reason')})")
    if not isinstance(endpoint, dict):
        return
    try:
        row, label, answer = sample_prediction(endpoint["endpoint"], _xcom(client, run_id, "preprocess"))
    except requests.RequestException as err:
        print(f"endpoint {endpoint['endpoint']} did not answer: {err}")
        return
    print(f"endpoint: {endpoint['endpoint']}/predict")
    print(f"sample prediction for a row of this run's test split {json.dumps(row)} (label {label}):\n"
          f"  -> {answer.status_code} {answer.text}")


def sample_prediction(endpoint: str, preprocessed: dict) -> tuple[dict, object, requests.Response]:
    """POST the first row of the run's test split, decoded to raw features, to the endpoint.

    The split is decoded with the preprocessor that wrote it, which the model's own may not be
    (tuning can pick another scaler).
    """
    from airflow_ray_ml_stages.preprocessor import Preprocessor, raw_split_rows

    preprocessor = Preprocessor.load(preprocessed["preprocessor_uri"])
    rows, labels = raw_split_rows(preprocessed["split_uris"]["test"], preprocessor, limit=1)
    answer = requests.post(f"{endpoint}/predict", json={"instances": rows}, timeout=30)
    label = labels[0] if preprocessor.classes is None else preprocessor.classes[int(labels[0])]
    return rows[0], label, answer


def source_param(text: str) -> list[str]:
    """``SOURCE=a.csv,b.csv`` as the DAG's ``source`` Param: local paths made absolute (the Ray job
    runs elsewhere), URLs as they are; a local path that does not exist is an error here, not later."""
    sources = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "://" in item:
            sources.append(item)
            continue
        path = Path(item).expanduser().resolve()
        if not path.exists():
            raise SystemExit(f"SOURCE {item!r} does not exist (resolved to {path}); give existing files or URLs")
        sources.append(str(path))
    return sources


def run_conf(conf: dict, source: str = "", label: str = "", app: str = "", task: str = "") -> dict:
    """The run conf `make run` sends: CONF, with SOURCE, LABEL, TASK and APP as the DAG's Params.

    APP names the Serve application and route (``APP=flats`` serves at ``/flats``) unless the conf
    does; without either, the DAG names them after the label (``LABEL=rent`` serves at ``/rent``,
    :func:`airflow_ray_ml_stages.wine.serve_endpoint`), so a model of another table never replaces
    the wine model or answers at ``/wine``.
    """
    conf = dict(conf)
    if source.strip():
        conf["source"] = source_param(source)
    if label.strip():
        conf["label_column"] = label.strip()
    if task.strip():
        conf["task"] = task.strip()
    if app.strip():
        conf.setdefault("serve_app", app.strip())
        conf.setdefault("serve_route", f"/{app.strip()}")
    return conf


def file_columns(path: str) -> list[str] | None:
    """The column names of a local CSV or Parquet file (None: not a local file this can read)."""
    if "://" in path or not os.path.isfile(path):
        return None
    if path.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        header = handle.readline()
    try:
        dialect = csv.Sniffer().sniff(header, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    return [name.strip() for name in next(csv.reader([header], dialect))]


def check_label(conf: dict, default_label: str) -> None:
    """Refuse, before any run, a label that is not a column of the user's local files."""
    label = conf.get("label_column") or default_label
    for path in conf.get("source") or []:
        columns = file_columns(path)
        if columns is not None and label not in columns:
            raise SystemExit(f"the label column {label!r} is not in {path} (its columns: {columns}); "
                             "name the column to predict: make run SOURCE=... LABEL=<column>")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python scripts/stack.py")
    parser.add_argument("command", choices=("up", "trigger", "down", "airflow"))
    parser.add_argument("--conf", default="{}", help="DAG run conf (JSON) for trigger")
    parser.add_argument("--source", default="",
                        help="your data instead of the demo: path(s) or URL(s), comma-separated")
    parser.add_argument("--label", default="", help="the column to predict in your data")
    parser.add_argument("--task", default="", help="regression or classification (default: the DAG's, regression)")
    parser.add_argument("--app", default="",
                        help="the Serve application and route (/APP); default: the label's name")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--ray-cpus", default="", help="CPUs the local Ray head advertises (default: what Ray detects)")
    parser.add_argument("--ray-gpus", default="", help="GPUs the local Ray head advertises (default: what Ray detects)")
    args = parser.parse_args()
    if args.command == "airflow":
        return run_airflow()
    if args.command == "up":
        up(cluster_size(args.ray_cpus, args.ray_gpus))
    elif args.command == "down":
        down()
    else:
        conf = run_conf(json.loads(args.conf), args.source, args.label, args.app, args.task)
        # the files SOURCE= names are allowed; a CONF's own "source" must lie under the allowed sources
        return trigger(conf, args.timeout, conf["source"] if args.source.strip() else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
