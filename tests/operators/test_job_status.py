"""Submission ids and the decision a task try takes about earlier jobs of the same task run."""

from __future__ import annotations

import pytest

from airflow_ray_ml.job_status import Action, RayJobStatus, attempt_id, base_submission_id, decide, is_task_runs_id

BASE = base_submission_id("wine", "manual__2026-01-01T00:00:00+00:00", "train")


def test_base_submission_id_same_inputs_same_id():
    assert BASE == base_submission_id("wine", "manual__2026-01-01T00:00:00+00:00", "train")


@pytest.mark.parametrize(
    "other",
    [
        ("wine", "manual__2026-01-02T00:00:00+00:00", "train", -1),
        ("wine", "manual__2026-01-01T00:00:00+00:00", "tune", -1),
        ("wine2", "manual__2026-01-01T00:00:00+00:00", "train", -1),
        ("wine", "manual__2026-01-01T00:00:00+00:00", "train", 0),
    ],
)
def test_base_submission_id_any_key_differs_id_differs(other):
    assert base_submission_id(*other) != BASE


def test_base_submission_id_colliding_slugs_still_differ():
    assert base_submission_id("a.b", "r", "t") != base_submission_id("a_b", "r", "t")


def test_base_submission_id_is_url_safe():
    weird = base_submission_id("Dag With Spaces/Slash", "scheduled__2026-01-01T00:00:00+00:00", "ta sk")
    assert all(ch.isalnum() or ch == "-" for ch in weird)


def test_a_named_id_reads_dag_name_task_and_is_still_the_task_runs_id():
    run = "manual__2026-01-01T00:00:00+00:00"
    named = base_submission_id("wine_quality_pipeline", run, "train", name="Sale Price")
    assert named.startswith("airflow-wine-quality-pipeline-sale-price-train-")
    # the name is for people: the hash is the task run's, so the page finds the job by it either way
    assert named.rsplit("-", 1)[1] == base_submission_id("wine_quality_pipeline", run, "train").rsplit("-", 1)[1]
    assert is_task_runs_id(named, "wine_quality_pipeline", run, "train")
    assert is_task_runs_id(base_submission_id("wine_quality_pipeline", run, "train"), "wine_quality_pipeline", run, "train")
    assert not is_task_runs_id(named, "wine_quality_pipeline", run, "tune")
    assert not is_task_runs_id(named, "wine_quality_pipeline", "manual__2026-01-02T00:00:00+00:00", "train")
    assert not is_task_runs_id(named, "wine_quality", run, "train")


def test_attempt_ids_number_from_the_base():
    assert [attempt_id(BASE, n) for n in range(3)] == [BASE, f"{BASE}-r1", f"{BASE}-r2"]


@pytest.mark.parametrize(
    ("existing", "action", "submission_id"),
    [
        ({}, Action.SUBMIT, BASE),
        ({BASE: "PENDING"}, Action.ATTACH, BASE),
        ({BASE: "RUNNING"}, Action.ATTACH, BASE),
        ({BASE: "SUCCEEDED"}, Action.REUSE, BASE),
        ({BASE: "FAILED"}, Action.SUBMIT, f"{BASE}-r1"),
        ({BASE: "STOPPED"}, Action.SUBMIT, f"{BASE}-r1"),
        ({BASE: "FAILED", f"{BASE}-r1": "RUNNING"}, Action.ATTACH, f"{BASE}-r1"),
        ({BASE: "FAILED", f"{BASE}-r1": "SUCCEEDED"}, Action.REUSE, f"{BASE}-r1"),
        ({BASE: "FAILED", f"{BASE}-r1": "STOPPED"}, Action.SUBMIT, f"{BASE}-r2"),
    ],
)
def test_decide_latest_attempt_decides(existing, action, submission_id):
    decision = decide(BASE, {key: RayJobStatus(value) for key, value in existing.items()})
    assert (decision.action, decision.submission_id) == (action, submission_id)


def test_job_status_terminal_states():
    assert {s for s in RayJobStatus if s.is_terminal()} == {
        RayJobStatus.SUCCEEDED, RayJobStatus.FAILED, RayJobStatus.STOPPED
    }
