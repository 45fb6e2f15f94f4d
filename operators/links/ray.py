"""Extra links shown on Ray tasks in the Airflow UI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

RAY_JOB_XCOM_KEY = "ray_job"
"""XCom key under which a stage operator records ``{"dashboard_url", "submission_id", "job_url"}``."""

SERVE_XCOM_KEY = "serve_endpoint"
"""XCom key under which the deploy operator records ``{"dashboard_url", "endpoint", "app"}``."""


PAGE_URL_PREFIX = "/ray-ml"
"""Where Airflow's api-server serves the "Ray ML" page (airflow_ray_ml.plugins.ray_ml)."""


def job_page_url(dashboard_url: str, submission_id: str) -> str:
    return f"{dashboard_url.rstrip('/')}/#/jobs/{submission_id}"


def cluster_page_url(dashboard_url: str) -> str:
    return f"{dashboard_url.rstrip('/')}/#/cluster"


class RayJobLink(BaseOperatorLink):
    """Link from a task to its Ray job's page in the Ray dashboard."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        record = XCom.get_value(ti_key=ti_key, key=RAY_JOB_XCOM_KEY)
        return record.get("job_url", "") if isinstance(record, dict) else ""


class RayServeEndpointLink(BaseOperatorLink):
    """Link from a deploy task to the endpoint's metadata."""

    name = "Serve endpoint"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        record = XCom.get_value(ti_key=ti_key, key=SERVE_XCOM_KEY)
        return f"{record['endpoint']}/metadata" if isinstance(record, dict) else ""


class RayServeDashboardLink(BaseOperatorLink):
    """Link from a deploy task to the Serve page of the Ray dashboard."""

    name = "Ray Serve"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        record = XCom.get_value(ti_key=ti_key, key=SERVE_XCOM_KEY)
        return f"{record['dashboard_url']}/#/serve" if isinstance(record, dict) else ""


class RayJobLogLink(BaseOperatorLink):
    """Link from a task to its Ray job's status and log on the "Ray ML" page: Airflow reads them
    through the ``ray_ml`` connection, so, unlike the dashboard, it needs no Ray token."""

    name = "Ray job log"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.configuration import conf
        from airflow.sdk.execution_time.xcom import XCom

        record = XCom.get_value(ti_key=ti_key, key=RAY_JOB_XCOM_KEY)
        if not isinstance(record, dict) or not record.get("submission_id"):
            return ""
        # Root-relative unless Airflow is served under a base URL (a path prefix or another host)
        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        return f"{base}{PAGE_URL_PREFIX}/jobs/{record['submission_id']}"
