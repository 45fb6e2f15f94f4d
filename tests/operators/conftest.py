"""Fixtures of the operator tests: a fake of Ray's Jobs API on loopback (tests/operators/fake_jobs_api.py)."""

from __future__ import annotations

import json

import pytest

from tests.operators.fake_jobs_api import FakeJobsApi

FAKE_CONN_ID = "ray_fake"


@pytest.fixture
def fake_jobs_api(monkeypatch, tmp_path):
    """A fake Ray dashboard on a free loopback port, reached through the connection ``ray_fake`` (with its
    token, an artifact root of the test's own, and the default number of retries 10 ms apart); stopped
    when the test ends."""
    with FakeJobsApi() as fake:
        monkeypatch.setenv(f"AIRFLOW_CONN_{FAKE_CONN_ID.upper()}", json.dumps({
            "conn_type": "ray_ml",
            "extra": {"dashboard_url": fake.url, "auth_token": fake.token, "artifact_root": str(tmp_path / "artifacts"),
                      "retry_max_wait_s": 0.01},
        }))
        yield fake
