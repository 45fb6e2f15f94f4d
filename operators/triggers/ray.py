"""RayJobTrigger: wait for a Ray job to finish without holding an Airflow worker slot."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_ray_ml.errors import RayClusterUnreachableError
from airflow_ray_ml.job_status import RayJobStatus

_CLASSPATH = "airflow_ray_ml.triggers.ray.RayJobTrigger"
# on_kill() must finish within the triggerer's [triggerer] on_kill_timeout (30 s by default).
STOP_TIMEOUT_S = 20.0
# Airflow 3.3 added BaseTrigger.on_kill(), which its triggerer calls when a user marks or clears the
# deferred task; an older triggerer only cancels the trigger, and the trigger's cleanup() stops the job.
TRIGGERER_CALLS_ON_KILL = hasattr(BaseTrigger, "on_kill")


class RayJobTrigger(BaseTrigger):
    """Follow a Ray job's log until the job has ended, then fire one event.

    Each line the job writes is logged here as ``[ray] <line>`` when it is written, so it reaches
    the deferred task's log. The event is ``{"status": "success" | "error", "submission_id",
    "job_status", "message", "log_offset"}``: ``success`` when the job SUCCEEDED, ``error`` when
    it FAILED or was STOPPED, when the cluster could not be reached for ``max_unreachable_s``, or
    when anything else went wrong; ``log_offset`` is how many characters of the job's log were
    logged here. Only primitives are serialised; the token and the retries of calls that failed
    transiently (the connection's ``retries`` and ``retry_max_wait_s``) are looked up again in the
    triggerer from the connection.

    When a user marks the deferred task failed or success, or clears it, :meth:`on_kill` stops
    the job (before Airflow 3.3, whose triggerer calls no ``on_kill``, :meth:`cleanup` does). A
    triggerer that restarts, or whose trigger another triggerer takes over, leaves the job running;
    the trigger starts over there and logs the job's log from its start again.

    :param submission_id: the Ray job's submission id.
    :param ray_conn_id: the Airflow connection to the Ray cluster.
    :param poll_interval_s: seconds between looks at the job's state while its log streams (the
        trigger fires this soon after the job ends), and between tries while the cluster cannot be reached.
    :param max_unreachable_s: how long the dashboard may stay unreachable before giving up.
    """

    _cancelled = False  # run() was cancelled by the triggerer; not serialized (the instance's own run)

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

    def _hook(self):
        from airflow_ray_ml.hooks.ray import RayHook

        return RayHook(self.ray_conn_id)

    def _event(self, status: str, job_status: str | None, message: str, log_offset: int) -> TriggerEvent:
        return TriggerEvent({"status": status, "submission_id": self.submission_id, "job_status": job_status,
                             "message": message, "log_offset": log_offset})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        offset = 0  # characters of the job's log logged so far
        unreachable_since: float | None = None
        try:
            while True:
                try:
                    # The stream ends when the job has ended (or the connection dropped: then the
                    # job's state says which, and a new stream resumes after what was logged).
                    async for line in hook.a_tail_job_logs(self.submission_id, offset=offset,
                                                           status_poll_s=self.poll_interval_s):
                        self.log.info("[ray] %s", line.rstrip("\r\n"))
                        offset += len(line)
                    info = await hook.a_get_job_info(self.submission_id)
                except RayClusterUnreachableError as err:
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since >= self.max_unreachable_s:
                        yield self._event("error", None, f"{err} The dashboard was unreachable for "
                                          f"{self.max_unreachable_s:.0f} s; the job may still be running.", offset)
                        return
                    self.log.info("Lost the Ray cluster (%s); trying again in %s s", err, self.poll_interval_s)
                    await asyncio.sleep(self.poll_interval_s)
                    continue
                unreachable_since = None
                if info is None:
                    yield self._event("error", None, f"Ray job {self.submission_id} does not exist at "
                                      f"{hook.dashboard_url}", offset)
                    return
                status = RayJobStatus(info["status"])
                if status.is_terminal():
                    outcome = "success" if status is RayJobStatus.SUCCEEDED else "error"
                    yield self._event(outcome, status.value, info.get("message") or "", offset)
                    return
                await asyncio.sleep(self.poll_interval_s)
        except asyncio.CancelledError:
            self._cancelled = True
            raise
        except Exception as err:  # a trigger must report, not crash the triggerer
            yield self._event("error", None, f"{type(err).__name__}: {err}", offset)

    async def on_kill(self) -> None:
        """Stop the job: Airflow calls this when a user marked the deferred task failed or success, or cleared it.

        Not on a triggerer restart or a deferral timeout (the operator stops the job then, see
        ``RayJobOperator.resume_execution``).
        """
        if await self._still_deferred():
            # Airflow 3.3 cancels a trigger that another triggerer took over (after this one missed
            # its heartbeats) the same way: the task is then still deferred, and the job goes on.
            self.log.info("The task is still deferred, followed by another triggerer; Ray job %s keeps running",
                          self.submission_id)
            return
        await self._stop_job()

    async def cleanup(self) -> None:
        """Before Airflow 3.3, stop the job where :meth:`on_kill` would have: the triggerer cancelled this
        trigger and its task is no longer deferred (a user marked or cleared it, or, unlike 3.3's
        on_kill, its deferral timed out: the operator would stop the job on resuming anyway).

        Airflow calls this on every exit of the trigger; a triggerer that stops or restarts cancels it
        too, but its task is still deferred, and where the state cannot be read the job goes on.
        """
        if TRIGGERER_CALLS_ON_KILL or not self._cancelled or await self._still_deferred(unknown=None) is not False:
            return
        await self._stop_job()

    async def _stop_job(self) -> None:
        self.log.info("The deferred task was marked or cleared; stopping Ray job %s", self.submission_id)
        stopped = await asyncio.wait_for(self._hook().a_stop_job(self.submission_id), STOP_TIMEOUT_S)
        self.log.info("Ray job %s %s", self.submission_id, "stopped" if stopped else "had already ended")

    async def _still_deferred(self, unknown: bool | None = False) -> bool | None:
        """Whether the task is still deferred; ``unknown`` where no triggerer runs this trigger or its
        answer cannot be read (``on_kill``'s usual meaning: a user stopped the task)."""
        ti = getattr(self, "task_instance", None)
        if ti is None:  # not run by a triggerer (dag.test, a direct call): nothing to ask
            return unknown
        from asgiref.sync import sync_to_async

        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        try:
            deferred = await sync_to_async(RuntimeTaskInstance.get_ti_count)(
                dag_id=ti.dag_id, map_index=ti.map_index, task_ids=[ti.task_id], run_ids=[ti.run_id],
                states=["deferred"],
            )
        except Exception as err:
            self.log.warning("Could not read the state of task %s (%s: %s)", ti.task_id, type(err).__name__, err)
            return unknown
        return deferred > 0
