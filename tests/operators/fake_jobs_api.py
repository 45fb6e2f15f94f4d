"""A small real HTTP server on loopback that answers like Ray 2.60's dashboard (Jobs API and the
routes RayHook reads), for the hook's and trigger's branches that need no Ray job.

Its answers are Ray's own, recorded once from a real cluster into ``jobs_api_answers/*.json``
(``python -m tests.operators.fake_jobs_api record`` records them again; see docs/development.md).
By default it keeps a few jobs in memory and answers for them as Ray would: a submit adds a job,
``GET /api/jobs/<id>`` describes it in its state, the log tail websocket streams its log as it
grows and closes once the job has ended, a stop stops it, and an unknown job gets Ray's 404.
Requests without the token get Ray's 401, with another token Ray's 403.

A test scripts the answers it needs per route, each route a queue used before the default::

    fake.add_job("job-1", log="started\\n")                       # RUNNING
    fake.script("GET", "/api/jobs/job-1", error(503), error(503))  # 503 twice, then the job's answer
    fake.script("GET", "/api/jobs/job-1/logs/tail", Stream(["a\\n"], close_code=None))  # hangs open
    fake.set_status("job-1", "SUCCEEDED")

and reads what reached it in ``fake.requests`` (``fake.count("POST", "/api/jobs/job-1/stop")``).
The ``fake_jobs_api`` fixture (tests/operators/conftest.py) starts one per test behind the Airflow
connection ``ray_fake``.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANSWERS_DIR = Path(__file__).parent / "jobs_api_answers"
# Recorded answers name their job by this placeholder; the fake puts the job's own id there.
SUBMISSION_ID = "<submission_id>"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# How often a live log tail looks for new text (Ray's own sends about once a second).
TAIL_INTERVAL_S = 0.05


def recorded(name: str, submission_id: str | None = None) -> dict[str, Any]:
    """A recorded answer (``status``, ``content_type``, ``body``...), for ``submission_id`` where it names a job."""
    text = (ANSWERS_DIR / f"{name}.json").read_text()
    if submission_id is not None:
        text = text.replace(SUBMISSION_ID, json.dumps(submission_id)[1:-1])
    return json.loads(text)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: ``body`` is sent as JSON unless ``content_type`` is text.

    :param delay_s: seconds to wait before answering (a slow dashboard, for client timeouts).
    :param drop: close the connection without answering (a dashboard that died mid-request).
    :param forward: the request still does what it asks (a submit adds its job), but this is the
        answer the client gets: a proxy that gave up while Ray took the request.
    """

    status: int = 200
    body: Any = None
    content_type: str = "application/json"
    delay_s: float = 0.0
    drop: bool = False
    forward: bool = False

    @classmethod
    def recorded(cls, name: str, submission_id: str | None = None, **changes: Any) -> "Answer":
        """Ray's recorded answer ``name`` (a file in ``jobs_api_answers``)."""
        data = recorded(name, submission_id)
        return cls(status=data["status"], body=data["body"], content_type=data["content_type"], **changes)


def error(status: int, text: str | None = None) -> Answer:
    """A plain-text error answer, such as a proxy's 502 or an overloaded dashboard's 503."""
    return Answer(status=status, body=text if text is not None else f"fake dashboard: HTTP {status}",
                  content_type="text/plain")


@dataclass(frozen=True)
class Stream:
    """A websocket answer to a log tail: its text messages, ``pause_s`` apart, then a close.

    :param close_code: the close frame's code (1000: the job ended); None keeps the stream open
        after its messages until the client leaves (a job that runs on).
    :param drop: end the connection without a close frame (a dashboard that died).
    """

    messages: tuple[str, ...] | list[str] = ()
    pause_s: float = 0.0
    close_code: int | None = 1000
    drop: bool = False


@dataclass
class FakeJob:
    """A job the fake knows: its state, its log so far, and what its submit sent."""

    submission_id: str
    status: str = "RUNNING"
    log: str = ""
    message: str | None = None
    submitted: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        """``GET /api/jobs/<id>``'s answer: Ray's recorded one for the job's state, with its own fields."""
        info = recorded(f"job_{self.status.lower()}", self.submission_id)["body"]
        info.update({key: self.submitted[key] for key in ("entrypoint", "metadata", "runtime_env")
                     if key in self.submitted})
        if self.message is not None:
            info["message"] = self.message
        return info


@dataclass(frozen=True)
class Seen:
    """One request that reached the fake."""

    method: str
    path: str
    query: dict[str, str]
    authorization: str | None
    body: bytes
    websocket: bool

    def json(self) -> Any:
        return json.loads(self.body)


class _LiveTail:
    def __init__(self, job: FakeJob) -> None:
        self.job = job


_JOB_ROUTE = re.compile(r"^/api/jobs/(?P<id>[^/]+)(?P<rest>/stop|/logs|/logs/tail)?$")
_PACKAGE_ROUTE = re.compile(r"^/api/packages/[^/]+/[^/]+$")


class FakeJobsApi:
    """The fake dashboard; ``start()`` serves it from a thread on a free loopback port, ``stop()`` ends it.

    :param token: the token a request must carry (``Authorization: Bearer <token>``); None accepts any.
    """

    def __init__(self, token: str | None = "fake-token") -> None:
        self.token = token
        self.jobs: dict[str, FakeJob] = {}
        self.requests: list[Seen] = []
        self.packages: set[str] = set()
        # the state and log a submitted job starts with (Ray's are PENDING for about a second, then RUNNING)
        self.submitted_status = "RUNNING"
        self.submitted_log = ""
        self._scripts: dict[tuple[str, str], deque] = {}
        self._lock = threading.Lock()
        self._sockets: set[Any] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- what a test uses ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, method: str, path: str, *answers: Answer | Stream) -> None:
        """Answer the next requests to ``method path`` with ``answers``, in order; then as by default.

        ``path`` is the request's decoded path without its query (``/api/jobs/job-1/logs/tail``).
        """
        with self._lock:
            self._scripts.setdefault((method.upper(), path), deque()).extend(answers)

    def add_job(self, submission_id: str, status: str = "RUNNING", log: str = "",
                message: str | None = None) -> FakeJob:
        with self._lock:
            job = self.jobs[submission_id] = FakeJob(submission_id, status, log, message)
        return job

    def set_status(self, submission_id: str, status: str, message: str | None = None) -> None:
        with self._lock:
            job = self.jobs[submission_id]
            job.status = status
            if message is not None:
                job.message = message

    def write_log(self, submission_id: str, text: str) -> None:
        """Append to a job's log, as the job writing it: a live tail sends it next."""
        with self._lock:
            self.jobs[submission_id].log += text

    def seen(self, method: str, path: str) -> list[Seen]:
        return [request for request in list(self.requests) if (request.method, request.path) == (method, path)]

    def count(self, method: str, path: str) -> int:
        return len(self.seen(method, path))

    # -- serving ------------------------------------------------------------------------------

    def start(self) -> "FakeJobsApi":
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._loop = loop = asyncio.new_event_loop()
        # a stop does not wait for answers still being delayed
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.2)
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.SockSite(runner, listener).start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name=f"fake-jobs-api-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Jobs API did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        async def close_streams() -> None:
            for ws in list(self._sockets):
                await ws.close()

        asyncio.run_coroutine_threadsafe(close_streams(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> "FakeJobsApi":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def _handle(self, request):
        websocket = request.headers.get("Upgrade", "").lower() == "websocket"
        body = await request.read()
        authorization = request.headers.get("Authorization")
        self.requests.append(Seen(request.method, request.path, dict(request.query), authorization, body, websocket))
        if self.token is not None and authorization != f"Bearer {self.token}":
            answer: Any = Answer.recorded("unauthorized" if authorization is None else "forbidden")
        else:
            with self._lock:
                queue = self._scripts.get((request.method, request.path))
                answer = queue.popleft() if queue else None
                if answer is None:
                    answer = self._default(request.method, request.path, body)
                elif isinstance(answer, Answer) and answer.forward:
                    self._default(request.method, request.path, body)
        if isinstance(answer, (Stream, _LiveTail)):
            return await self._stream(request, answer)
        return await self._answer(request, answer)

    async def _answer(self, request, answer: Answer):
        from aiohttp import web

        if answer.delay_s:
            await asyncio.sleep(answer.delay_s)
        if answer.drop:
            request.transport.close()
            return web.Response(status=500)
        if answer.content_type.startswith("application/json"):
            return web.Response(status=answer.status, text=json.dumps(answer.body), content_type="application/json")
        return web.Response(status=answer.status, text=str(answer.body), content_type=answer.content_type.split(";")[0])

    async def _stream(self, request, answer: Stream | _LiveTail):
        from aiohttp import web

        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.add(ws)
        try:
            if isinstance(answer, _LiveTail):
                await self._follow(ws, answer.job)
                return ws
            for number, message in enumerate(answer.messages):
                if number and answer.pause_s:
                    await asyncio.sleep(answer.pause_s)
                await ws.send_str(message)
            if answer.drop:
                request.transport.close()
            elif answer.close_code is None:
                async for _ in ws:  # open until the client leaves (pings are answered meanwhile)
                    pass
            else:
                await ws.close(code=answer.close_code)
        finally:
            self._sockets.discard(ws)
        return ws

    async def _follow(self, ws, job: FakeJob) -> None:
        """Send the job's log as it grows; close normally once the job has ended and all is sent."""
        sent = 0
        while not ws.closed:
            with self._lock:
                text, ended = job.log[sent:], job.status in TERMINAL
            if text:
                await ws.send_str(text)
                sent += len(text)
            elif ended:
                await ws.close()
                return
            else:
                await asyncio.sleep(TAIL_INTERVAL_S)

    def _default(self, method: str, path: str, body: bytes) -> Answer | _LiveTail:
        """Ray's answer to a request no script took (called holding the lock)."""
        if (method, path) == ("GET", "/api/version"):
            return Answer.recorded("version")
        if (method, path) == ("GET", "/api/v0/nodes"):
            return Answer.recorded("nodes")
        if (method, path) == ("GET", "/api/cluster_status"):
            return Answer.recorded("cluster_status")
        if (method, path) == ("GET", "/api/serve/applications/"):
            return Answer.recorded("serve_applications")
        if (method, path) == ("GET", "/api/jobs/"):
            return Answer(body=[job.info() for job in self.jobs.values()])
        if (method, path) == ("POST", "/api/jobs/"):
            return self._submit(json.loads(body or b"{}"))
        if _PACKAGE_ROUTE.match(path) and method in ("GET", "PUT"):
            if method == "PUT":
                self.packages.add(path)
                return Answer.recorded("package_uploaded")
            return Answer.recorded("package_found" if path in self.packages else "package_missing")
        route = _JOB_ROUTE.match(path)
        if route is None:
            return error(404, f"fake dashboard: no route {method} {path}")
        submission_id, rest = route["id"], route["rest"] or ""
        job = self.jobs.get(submission_id)
        answers = {  # (method, rest): (the answer's name for an unknown job, the answer for a known one)
            ("GET", ""): ("job_unknown", lambda job: Answer(body=job.info())),
            ("GET", "/logs"): ("logs_unknown", lambda job: Answer(body={"logs": job.log})),
            ("GET", "/logs/tail"): ("tail_unknown", _LiveTail),
            ("POST", "/stop"): ("stop_unknown", self._stop),
        }
        if (method, rest) not in answers:
            return error(405, f"fake dashboard: no route {method} {path}")
        unknown, known = answers[(method, rest)]
        return Answer.recorded(unknown, submission_id) if job is None else known(job)

    def _submit(self, request: dict[str, Any]) -> Answer:
        submission_id = request.get("submission_id") or f"raysubmit_{uuid.uuid4().hex[:16]}"
        if submission_id in self.jobs:
            return Answer.recorded("submit_exists", submission_id)
        self.jobs[submission_id] = FakeJob(submission_id, self.submitted_status, self.submitted_log, submitted=request)
        return Answer.recorded("submit", submission_id)

    def _stop(self, job: FakeJob) -> Answer:
        if job.status in TERMINAL:
            return Answer.recorded("stop_ended", job.submission_id)
        job.status = "STOPPED"
        return Answer.recorded("stop", job.submission_id)


# -- recording Ray's answers --------------------------------------------------------------------

# Jobs whose answers are recorded: a short one that succeeds (its last line has no line end), one
# that fails, and one that sleeps until it is stopped.
_RECORDED_JOBS = {
    "rec-succeeded": "python -c \"print('line-1'); print('line-2', end='')\"",
    "rec-failed": "python -c \"import sys; print('failing'); sys.exit(3)\"",
    "rec-sleeping": "python -c \"import time; print('started', flush=True); time.sleep(600)\"",
}


def record(dashboard_url: str, token: str, out_dir: Path = ANSWERS_DIR) -> list[str]:
    """Record a real dashboard's answers to what RayHook and Ray's job client ask into ``out_dir``.

    Needs a cluster with token auth and nothing else running on it. Returns the answers' names.
    """
    import io
    import time
    import zipfile

    import aiohttp
    import requests

    auth = {"Authorization": f"Bearer {token}"}
    answers: dict[str, dict[str, Any]] = {}

    def keep(name: str, response: requests.Response, request: str) -> requests.Response:
        content_type = response.headers.get("Content-Type", "text/plain")
        try:
            body = response.json() if content_type.startswith("application/json") else response.text
        except ValueError:
            body = response.text
        answers[name] = {"request": request, "status": response.status_code,
                         "content_type": content_type, "body": body}
        return response

    def call(name: str | None, method: str, path: str, headers: dict | None = None, **kwargs: Any) -> requests.Response:
        response = requests.request(method, f"{dashboard_url}{path}", headers=auth if headers is None else headers,
                                    timeout=30, **kwargs)
        return keep(name, response, f"{method} {path}") if name else response

    def status_of(submission_id: str) -> str:
        return call(None, "GET", f"/api/jobs/{submission_id}").json()["status"]

    def wait_for(submission_id: str, wanted: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while (status := status_of(submission_id)) != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {submission_id} is {status}, not {wanted}, after {timeout_s} s")
            time.sleep(0.1)

    async def tail(submission_id: str, headers: dict) -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=headers) as session:
            try:
                async with session.ws_connect(f"{dashboard_url}/api/jobs/{submission_id}/logs/tail") as stream:
                    messages = [message.data async for message in stream if message.type is aiohttp.WSMsgType.TEXT]
                    return {"request": "GET /api/jobs/<submission_id>/logs/tail (websocket)", "status": 101,
                            "messages": messages, "close_code": stream.close_code}
            except aiohttp.WSServerHandshakeError as err:
                return {"request": "GET /api/jobs/<submission_id>/logs/tail (websocket)", "status": err.status,
                        "content_type": "text/plain", "body": err.message}

    call("version", "GET", "/api/version")
    call("nodes", "GET", "/api/v0/nodes", params={"detail": "1", "limit": "1000"})
    call("cluster_status", "GET", "/api/cluster_status")
    call("serve_applications", "GET", "/api/serve/applications/")
    call("unauthorized", "GET", "/api/version", headers={})
    call("forbidden", "GET", "/api/version", headers={"Authorization": "Bearer not-the-token"})
    answers["tail_unauthorized"] = asyncio.run(tail("no-such-job", {}))

    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("recorded/__init__.py", "")
    package_path = f"/api/packages/gcs/_ray_pkg_{uuid.uuid4().hex}.zip"
    call("package_missing", "GET", package_path)
    call("package_uploaded", "PUT", package_path, data=package.getvalue())
    call("package_found", "GET", package_path)

    ok, failed, sleeping = _RECORDED_JOBS
    call("submit", "POST", "/api/jobs/", json={"entrypoint": _RECORDED_JOBS[ok], "submission_id": ok})
    call("job_pending", "GET", f"/api/jobs/{ok}")
    call("submit_exists", "POST", "/api/jobs/", json={"entrypoint": _RECORDED_JOBS[ok], "submission_id": ok})
    answers["tail"] = asyncio.run(tail(ok, auth))
    wait_for(ok, "SUCCEEDED")
    call("job_succeeded", "GET", f"/api/jobs/{ok}")
    call("logs", "GET", f"/api/jobs/{ok}/logs")
    call("stop_ended", "POST", f"/api/jobs/{ok}/stop")

    call(None, "POST", "/api/jobs/", json={"entrypoint": _RECORDED_JOBS[failed], "submission_id": failed})
    wait_for(failed, "FAILED")
    call("job_failed", "GET", f"/api/jobs/{failed}")
    call("logs_failed", "GET", f"/api/jobs/{failed}/logs")

    call(None, "POST", "/api/jobs/", json={"entrypoint": _RECORDED_JOBS[sleeping], "submission_id": sleeping})
    wait_for(sleeping, "RUNNING")
    call("job_running", "GET", f"/api/jobs/{sleeping}")
    call("stop", "POST", f"/api/jobs/{sleeping}/stop")
    wait_for(sleeping, "STOPPED", 30)
    call("job_stopped", "GET", f"/api/jobs/{sleeping}")

    unknown = "rec-unknown"
    call("job_unknown", "GET", f"/api/jobs/{unknown}")
    call("logs_unknown", "GET", f"/api/jobs/{unknown}/logs")
    call("stop_unknown", "POST", f"/api/jobs/{unknown}/stop")
    answers["tail_unknown"] = asyncio.run(tail(unknown, auth))

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, answer in answers.items():
        text = _scrub(json.dumps(answer, indent=1, sort_keys=True) + "\n", (*_RECORDED_JOBS, unknown))
        if token in text:
            raise RuntimeError(f"the recorded answer {name!r} holds the cluster's token; not written")
        (out_dir / f"{name}.json").write_text(text)
    return sorted(answers)


def _scrub(text: str, submission_ids: tuple[str, ...]) -> str:
    """A recorded answer without its jobs' ids (the placeholder instead) or this machine's paths."""
    import ray

    for submission_id in submission_ids:
        text = text.replace(submission_id, SUBMISSION_ID)
    return text.replace(str(Path(ray.__file__).resolve().parent.parent), "<site-packages>")


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.operators.fake_jobs_api record``: record Ray's answers from a fresh local cluster."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=["record"])
    parser.add_argument("--out", type=Path, default=ANSWERS_DIR, help="where the answers go (default: %(default)s)")
    args = parser.parse_args(argv)

    from scripts.localcluster import LocalRayCluster, new_token

    cluster = LocalRayCluster(temp_dir=tempfile.mkdtemp(prefix="rr", dir="/tmp"), num_cpus=2, num_gpus=0,
                              token=new_token())
    try:
        cluster.start()
        names = record(cluster.dashboard_url, cluster.token, args.out)
    finally:
        cluster.stop()
    print(f"recorded {len(names)} answers into {args.out}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
