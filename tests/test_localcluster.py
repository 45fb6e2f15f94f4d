"""The local Ray cluster's temp dir: short whatever the checkout's path, private, checked, removed.

Unix socket paths are limited (107 bytes; 97 for HAProxy's), and Ray and Serve's HAProxy put theirs
under the temp dir, so a temp dir inside a checkout with a long path broke `make run`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from airflow_ray_ml.errors import RayOperatorError
from airflow_ray_ml.hooks.ray import RayHook
from scripts import localcluster
from airflow_ray_ml_stages.errors import ClusterError
from scripts.localcluster import (
    LocalRayCluster, check_socket_paths, claim_serve_ports, default_temp_dir, new_token, private_dir,
)
from tests.conftest import ROOT, load_dag
from tests.train_data import write_preprocessed

LONG_PARENT = "/home/a-user-with-a-long-name/src/" + "nested-projects/" * 5 + "airflow-ray-ml"


def test_free_port_picks_below_the_ephemeral_range_in_its_part_never_twice_and_never_one_in_use(
        monkeypatch, tmp_path):
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert localcluster.LISTEN_PORTS.stop <= low or localcluster.LISTEN_PORTS.start > high
    base = localcluster.free_port()  # three ports in a row, free now, stand in for the range
    while not all(map(localcluster.port_free, range(base, base + 3))):
        base = localcluster.free_port()
    monkeypatch.setenv(localcluster.PORT_RANGE_ENV, f"{base}-{base + 2}")  # as a worker of the suite is given
    monkeypatch.setattr(localcluster, "_PICKED", set())
    monkeypatch.setattr(localcluster, "_port_claims", lambda: tmp_path)  # forget this process's claims too
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", base + 1))
        server.listen()
        assert sorted(localcluster.free_port() for _ in range(2)) == [base, base + 2]
        with pytest.raises(ClusterError, match=f"no free port in {base}-{base + 2}"):
            localcluster.free_port()


def test_a_port_another_live_process_picked_is_not_picked_until_that_process_is_gone(monkeypatch, tmp_path):
    """Serve binds a node's fallback-proxy and HAProxy ports only at the first deploy, so a port picked
    for them looks free until then; a process beside it (the CLI a test starts a node with) must not
    pick it meanwhile."""
    base = localcluster.free_port()
    while not localcluster.port_free(base):
        base = localcluster.free_port()
    monkeypatch.setenv(localcluster.PORT_RANGE_ENV, f"{base}-{base}")
    monkeypatch.setattr(localcluster, "_port_claims", lambda: tmp_path)
    picker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"port-{base}").write_text(str(picker.pid))  # as free_port leaves it in that process
        with pytest.raises(ClusterError, match=f"no free port in {base}-{base}"):
            localcluster.free_port()
        node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            (tmp_path / f"port-{base}").write_text(str(os.getpid()))
            localcluster.hand_over_ports([base], node.pid)  # the node that binds it later holds it now
            picker.kill()
            picker.wait()
            assert (tmp_path / f"port-{base}").read_text() == str(node.pid)
            with pytest.raises(ClusterError):
                localcluster.free_port()
        finally:
            node.kill()
            node.wait()
        monkeypatch.setattr(localcluster, "_PICKED", set())
        assert localcluster.free_port() == base  # its holder is gone: taken over
        assert (tmp_path / f"port-{base}").read_text() == str(os.getpid())
    finally:
        picker.kill()
        picker.wait()


def test_the_suites_workers_pick_ports_from_parts_that_do_not_overlap():
    parts = [range(int(low), int(high) + 1) for low, high in
             (localcluster.split_ports(part, 2).split("-") for part in range(2))]
    assert not set(parts[0]) & set(parts[1]) and len(parts[0]) == len(parts[1]) > 800
    assert all(set(part) <= set(localcluster.LISTEN_PORTS) for part in parts)


def _unused_dir(length: int) -> str:
    """A path under /tmp of exactly ``length`` characters that does not exist."""
    path = f"/tmp/rayml-test-{uuid.uuid4().hex}"
    path = (path + "x" * length)[:length]
    assert len(path) == length and not os.path.exists(path)
    return path


@pytest.mark.parametrize(
    ("length", "haproxy", "named"),
    [
        # HAProxy's <dir>/hp/<56-hex node id>/admin.sock passes 97 once the dir passes 24 characters
        (35, "1", "RAY_SERVE_HAPROXY_SOCKET_PATH"),
        # Ray's <dir>/ray/session_<date>_<time>_<micro>_<pid>/sockets/plasma_store.<n> passes 107 after 36
        (45, "0", "plasma_store"),
    ],
)
def test_a_temp_dir_too_long_for_a_socket_is_refused_before_anything_starts(length, haproxy, named):
    temp_dir = _unused_dir(length)
    cluster = LocalRayCluster(temp_dir=temp_dir, num_cpus=1, num_gpus=0,
                              extra_env={"RAY_SERVE_ENABLE_HA_PROXY": haproxy})
    with pytest.raises(ClusterError) as refused:
        cluster.start()
    message = str(refused.value)
    assert named in message and temp_dir in message
    assert "over the limit" in message and "set TMPDIR to a short directory such as /tmp" in message
    assert cluster.leader_pids == [] and not os.path.exists(temp_dir)


def test_the_default_temp_dir_is_short_and_fits_every_socket_whatever_the_checkout_path():
    pid_file = f"{LONG_PARENT}/.run/ray.json"
    assert len(pid_file) > 100
    temp_dir = default_temp_dir(pid_file)
    assert Path(temp_dir).parent == Path(tempfile.gettempdir())
    assert LONG_PARENT not in temp_dir
    # the environment a cluster in that dir runs with, HAProxy on or not, passes the check
    for haproxy in ("1", "0"):
        env = LocalRayCluster(temp_dir=temp_dir, extra_env={"RAY_SERVE_ENABLE_HA_PROXY": haproxy}).env()
        check_socket_paths(temp_dir, env)
    # every HAProxy file of the cluster is in its own dir, none in Ray's shared default
    haproxy_paths = {name: value for name, value in env.items()
                     if name.startswith("RAY_SERVE_HAPROXY_") and name.endswith(("_LOC", "_PATH", "_BASE", "_FILE"))
                     and name != "RAY_SERVE_HAPROXY_BINARY_PATH"}
    assert set(haproxy_paths) == {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE", "RAY_SERVE_HAPROXY_SERVER_STATE_FILE",
    }
    assert all(value.startswith(temp_dir + os.sep) for value in haproxy_paths.values()), haproxy_paths

    assert default_temp_dir(pid_file) == temp_dir  # one checkout, one dir: its logs are found again
    assert default_temp_dir(f"{LONG_PARENT}-copy/.run/ray.json") != temp_dir


def test_the_caller_environment_cannot_make_two_clusters_share_haproxy_files(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_SOCKET_PATH", "/tmp/haproxy-serve/admin.sock")
    one, two = (LocalRayCluster(temp_dir=_unused_dir(20)).env() for _ in range(2))
    assert one["RAY_SERVE_HAPROXY_SOCKET_PATH"] != two["RAY_SERVE_HAPROXY_SOCKET_PATH"]


def test_two_clusters_never_share_a_serve_listener_port_ray_fixes():
    one, two = (LocalRayCluster(temp_dir=_unused_dir(20)).env() for _ in range(2))
    ports = [{int(env[name]) for name in localcluster._OWN_PORT_ENV} for env in (one, two)]
    assert all(len(own) == len(localcluster._OWN_PORT_ENV) for own in ports)
    assert not ports[0] & ports[1] and not (ports[0] | ports[1]) & {8500, 9500}


def test_each_node_claims_its_own_serve_ports_and_a_gone_nodes_block_is_taken_over(tmp_path):
    blocks = range(19000, 19040, 10)  # outside the blocks real nodes claim
    held, ports = claim_serve_ports(tmp_path, blocks)
    other, other_ports = claim_serve_ports(tmp_path, blocks)
    assert held != other  # both claimed by this live process: two blocks
    first, last = (int(ports[f"RAY_SERVE_DIRECT_INGRESS_{end}_HTTP_PORT"]) for end in ("MIN", "MAX"))
    assert last - first == 9 and int(ports["RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT"]) == first + 5000
    assert not set(range(first, last + 1)) & set(range(int(other_ports["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]),
                                                       int(other_ports["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) + 1))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    held.write_text(str(gone.pid))  # the node that held the first block has stopped
    taken, taken_ports = claim_serve_ports(tmp_path, blocks)
    assert taken == held and taken_ports == ports and taken.read_text() == str(os.getpid())
    with socket.socket() as listener:  # something else listens in the next free block: skipped
        listener.bind(("0.0.0.0", blocks[2]))
        assert claim_serve_ports(tmp_path, blocks)[0].name == str(blocks[3])
    with pytest.raises(ClusterError, match="every block of Serve replica ports is held"):
        claim_serve_ports(tmp_path, blocks)


def test_a_cluster_given_another_python_runs_that_venvs_ray_and_its_jobs_python(tmp_path):
    venv_bin = tmp_path / "cluster-venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "ray").touch()
    cluster = LocalRayCluster(temp_dir=str(tmp_path / "c"), python=str(venv_bin / "python"))
    assert cluster._ray_cli() == [str(venv_bin / "ray")]
    assert cluster.env()["PATH"].split(os.pathsep)[0] == str(venv_bin)  # a job's `python` is that venv's
    default = LocalRayCluster(temp_dir=str(tmp_path / "d"))
    assert default.env()["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_private_dir_refuses_a_path_that_is_not_a_directory_of_ours(tmp_path):
    made = private_dir(str(tmp_path / "mine"))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert private_dir(made) == made  # ours already: accepted
    link = tmp_path / "link"
    link.symlink_to(made)  # someone's symlink where the dir should be
    with pytest.raises(ClusterError, match="not a directory of yours.*TMPDIR"):
        private_dir(str(link))


def _running(pids) -> list[int]:
    """Those of ``pids`` that are still running (zombies only wait for their parent to reap them)."""
    running = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                running.append(pid)
        except OSError:
            continue
    return running


def _listening_beyond_loopback(pids: list[int]) -> set[tuple[int, str, int]]:
    """``(pid, address, port)`` of each socket one of ``pids`` listens on beyond 127.0.0.0/8 and ::1."""
    import ipaddress

    import psutil

    exposed = set()
    for connection in psutil.net_connections(kind="inet"):
        if connection.status != psutil.CONN_LISTEN or connection.pid not in pids:
            continue
        address = ipaddress.ip_address(connection.laddr.ip)
        if not (getattr(address, "ipv4_mapped", None) or address).is_loopback:
            exposed.add((connection.pid, connection.laddr.ip, connection.laddr.port))
    return exposed


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running_naming(text: str) -> list[int]:
    """Running processes on this machine, of any session, whose command line contains ``text``."""
    return [pid for pid in _running(int(e) for e in os.listdir("/proc") if e.isdigit()) if text in _cmdline(pid)]


@pytest.fixture(scope="module")
def cluster_of_its_own():
    """A head given no temp dir, whose Serve no test has started yet: the tests below share it.

    Its stop must end every process of its session, the dashboard's module processes that outlive
    the ``ray start`` leader included, and remove the dir it made (checked when the module is done with it)."""
    cluster = LocalRayCluster(num_cpus=1, num_gpus=0, token=new_token())
    started: list[int] = []
    try:
        cluster.start()
        started = localcluster.session_pids(cluster.leader_pids[0])
        yield cluster
    finally:
        cluster.stop()
    assert len(started) > 3 and _running(started) == [], [_cmdline(pid) for pid in _running(started)]
    assert not os.path.exists(cluster.temp_dir), f"stop left the cluster's own temp dir {cluster.temp_dir}"


@pytest.mark.integration
def test_a_cluster_given_no_temp_dir_gets_a_private_short_one(cluster_of_its_own):
    temp_dir = cluster_of_its_own.temp_dir
    assert Path(temp_dir).parent == Path(tempfile.gettempdir())
    # private while Ray runs, though Ray makes its own temp dir (inside) world-writable
    info = os.stat(temp_dir)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert Path(cluster_of_its_own.ray_temp_dir).parent == Path(temp_dir)
    assert (Path(cluster_of_its_own.ray_temp_dir) / "session_latest" / "logs").is_dir()
    # its node's Serve replicas listen in a block of ports that its claim holds
    (leader,) = cluster_of_its_own.leader_pids
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{leader}/environ").read_text().split("\0") if "=" in item)
    claim = localcluster._port_claims() / environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"]
    assert claim.read_text() == str(leader)


@pytest.mark.integration
def test_a_serve_config_that_fails_to_start_reports_its_cause(cluster_of_its_own, monkeypatch):
    # A port this test holds on loopback: Serve's proxy cannot bind it, and the dashboard answers
    # with the whole traceback, the cause on its last line.
    monkeypatch.setenv("AIRFLOW_CONN_RAY_REJECTS", json.dumps({
        "conn_type": "ray_ml",
        "extra": {"dashboard_url": cluster_of_its_own.dashboard_url, "auth_token": cluster_of_its_own.token}}))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = {"http_options": {"host": "127.0.0.1", "port": port},
                  "applications": [{"name": "never", "import_path": "nowhere:app", "route_prefix": "/never"}]}
        with pytest.raises(RayOperatorError) as rejected:
            RayHook("ray_rejects").put_serve_applications(config)
    message = str(rejected.value)
    assert message.startswith("Ray Serve rejected the config (HTTP 500): ...\n")
    # the cause, in the words of whichever proxy Serve runs (HAProxy, or its Python proxy)
    cause = "\n".join(message.splitlines()[-3:])
    assert f"127.0.0.1:{port}" in cause and ("Address already in use" in cause or "Failed to bind" in cause), message


def _copy_checkout(target: Path) -> None:
    """The repository's tracked files (as they are in the working tree), without .venv or build output."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, names.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def _cli(command: str, checkout: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m scripts.localcluster`` as `make run` / `make stop` run it, from the checkout."""
    return subprocess.run(
        [sys.executable, "-m", "scripts.localcluster", command, "--pid-file", str(checkout / ".run" / "ray.json"),
         *args],
        cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout / "include")},
        capture_output=True, text=True, timeout=180,
    )


@pytest.mark.integration
def test_the_local_stack_started_from_a_checkout_with_a_long_path_serves_a_deployed_model(
        tmp_path, monkeypatch, airflow_db):
    """The checkout's absolute path is at least 60 characters long (here over 100). The head starts as
    `make run RAY_CPUS=3 RAY_GPUS=0` starts it (scripts/stack.py's size), and advertises that size."""
    from airflow_ray_ml_stages import wine
    from tests.scripts.test_stack import stack

    checkout = tmp_path / ("a-directory-whose-name-makes-the-path-long-" + "x" * 40) / "airflow-ray-ml"
    assert len(str(checkout)) >= 100
    _copy_checkout(checkout)
    pid_file = checkout / ".run" / "ray.json"
    try:
        token_file = checkout / ".run" / "ray_auth_token"
        started = _cli("start", checkout, "--token-file", str(token_file),
                       "--dashboard-port", str(localcluster.free_port()), *stack.cluster_size("3", "0"))
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads(pid_file.read_text())
        nodes = requests.get(f"{state['dashboard_url']}/api/v0/nodes", params={"detail": "1"}, timeout=30,
                             headers={"Authorization": f"Bearer {token_file.read_text().strip()}"})
        (node,) = nodes.json()["data"]["result"]["result"]
        assert node["resources_total"]["CPU"] == 3 and "GPU" not in node["resources_total"]  # not what Ray detects
        temp_dir = state["temp_dir"]
        assert temp_dir == default_temp_dir(str(pid_file)) and state["remove_temp_dir"] is True
        assert not temp_dir.startswith(str(checkout))
        assert f"Ray logs in {temp_dir}/ray/session_latest/logs" in started.stdout
        assert Path(temp_dir, "ray", "session_latest", "logs").is_dir()
        assert stat.S_IMODE(os.stat(temp_dir).st_mode) == 0o700
        # the ports Serve binds only at the first deploy stay claimed by the node, not by the CLI that exited
        node_env = Path(f"/proc/{state['pid']}/environ").read_bytes().decode().split("\0")
        serve_ports = [value for name, _, value in (item.partition("=") for item in node_env)
                       if name in localcluster._OWN_PORT_ENV]
        assert len(serve_ports) == len(localcluster._OWN_PORT_ENV)
        assert {(localcluster._port_claims() / f"port-{port}").read_text() for port in serve_ports} == {
            str(state["pid"])}

        monkeypatch.setenv("AIRFLOW_CONN_RAY_LONGPATH", json.dumps({
            "conn_type": "ray_ml",
            "extra": {"dashboard_url": state["dashboard_url"],
                      "auth_token": token_file.read_text().strip(),
                      "artifact_root": str(checkout / "artifacts"),
                      "serve_url": f"http://127.0.0.1:{localcluster.free_port()}"},
        }))
        when = datetime.now(timezone.utc)
        preprocess = write_preprocessed(tmp_path / "splits", rows=600, seed=5)
        dag_run = load_dag("longpath_serve").test(logical_date=when, run_after=when,
                                                  run_conf={"preprocess": preprocess})
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
        assert dag_run.state == "success", states

        rows = wine.generate(rows=20, seed=99).drop(columns=[wine.LABEL]).iloc[:2].to_dict("records")
        answer = requests.post(f"{RayHook('ray_longpath').serve_url}/longpath/predict",
                               json={"instances": rows}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["predictions"]) == 2
        # the answer came through HAProxy, whose admin socket is in the short dir
        assert len(list(Path(temp_dir, "hp").glob("*/admin.sock"))) == 1
        session = localcluster.session_pids(int(state["pid"]))
        assert any("haproxy" in _cmdline(pid) for pid in session)
        # the stack listens on loopback only, the port each Serve replica binds for calls between
        # deployments included (on the node's address: docs/deployment.md#listening-sockets)
        replicas = {pid for pid in session if _cmdline(pid).startswith("ray::ServeReplica")}
        assert replicas and _listening_beyond_loopback(session) == set()

        stopped = _cli("stop", checkout)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert _running(session) == [] and _running(localcluster.session_pids(int(state["pid"]))) == []
        assert _running_naming(temp_dir) == []  # nothing of the cluster escaped its session either
        assert not os.path.exists(temp_dir) and not pid_file.exists()
    finally:
        if pid_file.exists():
            _cli("stop", checkout)
