"""The few Airflow names that moved between the releases the package supports (3.1.1 and newer).

Airflow 3.2 moved these into the task SDK (``airflow.sdk.exceptions``, ``airflow.sdk.conf``); 3.1
has them where Airflow 2 kept them. On 3.2 and newer the old places are deprecated aliases of the
same objects, so everything imports them from here and gets the task SDK's own where it exists.
The timetable a DAG file schedules with (``CronTriggerTimetable``) is the task SDK's where it
has them, else the scheduler's.
"""

from __future__ import annotations

try:
    from airflow.sdk import CronTriggerTimetable
except ImportError:  # Airflow 3.1: the scheduler's own class
    from airflow.timetables.trigger import CronTriggerTimetable
try:
    from airflow.sdk import conf
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferralTimeout, TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.configuration import conf
    from airflow.exceptions import AirflowFailException, AirflowSkipException, TaskDeferralTimeout, TaskDeferred

__all__ = ["CronTriggerTimetable", "AirflowFailException", "AirflowSkipException", "TaskDeferralTimeout", "TaskDeferred", "conf"]
