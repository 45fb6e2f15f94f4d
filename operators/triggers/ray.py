"""RayJobTrigger: wait for a Ray job to finish without holding an Airflow worker slot."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx

from airflow.triggers.base import BaseTrigger, TriggerEvent

from operators.job_status import RayJobStatus

_CLASSPATH = "operators.triggers.ray.RayJobTrigger"


class RayJobTrigger(BaseTrigger):
    """Poll a Ray job's status over the Jobs REST API until it is terminal, then fire one event.

    The event is ``{"status": "success" | "error", "submission_id", "job_status", "message"}``:
    ``success`` when the job SUCCEEDED, ``error`` when it FAILED or was STOPPED, when the cluster
    could not be reached for ``max_unreachable_s``, or when anything else went wrong. Only
    primitives are serialised; the token is looked up again in the triggerer from the connection.

    :param submission_id: the Ray job's submission id.
    :param ray_conn_id: the Airflow connection to the Ray cluster.
    :param poll_interval_s: seconds between status requests.
    :param max_unreachable_s: how long the dashboard may stay unreachable before giving up.
    """

    def __init__(self, submission_id: str, ray_conn_id: str = "ray_default", poll_interval_s: float = 2.0,
                 max_unreachable_s: float = 300.0) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.ray_conn_id = ray_conn_id
        self.poll_interval_s = poll_interval_s
        self.max_unreachable_s = max_unreachable_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return _CLASSPATH, {
            "submission_id": self.submission_id,
            "ray_conn_id": self.ray_conn_id,
            "poll_interval_s": self.poll_interval_s,
            "max_unreachable_s": self.max_unreachable_s,
        }

    def _event(self, status: str, job_status: str | None, message: str) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "submission_id": self.submission_id, "job_status": job_status, "message": message}
        )

    async def _connection_settings(self) -> tuple[str, dict[str, str], bool]:
        from operators.hooks.ray import RayHook

        def settings() -> tuple[str, dict[str, str], bool]:
            hook = RayHook(self.ray_conn_id)
            return hook.dashboard_url, hook.auth_headers(), hook.verify_tls

        return await asyncio.to_thread(settings)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            url, headers, verify = await self._connection_settings()
            unreachable_for = 0.0
            async with httpx.AsyncClient(headers=headers, verify=verify, timeout=30.0) as client:
                while True:
                    try:
                        response = await client.get(f"{url}/api/jobs/{self.submission_id}")
                    except httpx.HTTPError as err:
                        unreachable_for += self.poll_interval_s
                        if unreachable_for >= self.max_unreachable_s:
                            yield self._event(
                                "error", None,
                                f"the Ray dashboard at {url} was unreachable for {unreachable_for:.0f} s "
                                f"({type(err).__name__}); the job may still be running",
                            )
                            return
                        await asyncio.sleep(self.poll_interval_s)
                        continue
                    unreachable_for = 0.0
                    if response.status_code == 404:
                        yield self._event("error", None, f"Ray job {self.submission_id} does not exist at {url}")
                        return
                    if response.status_code >= 400:
                        yield self._event(
                            "error", None,
                            f"the Ray Jobs API answered HTTP {response.status_code}: {response.text[:200]}",
                        )
                        return
                    info = response.json()
                    status = RayJobStatus(info["status"])
                    if status.is_terminal():
                        outcome = "success" if status is RayJobStatus.SUCCEEDED else "error"
                        yield self._event(outcome, status.value, info.get("message") or "")
                        return
                    await asyncio.sleep(self.poll_interval_s)
        except Exception as err:  # a trigger must report, not crash the triggerer
            yield self._event("error", None, f"{type(err).__name__}: {err}")
