"""What a cluster holds, who holds it and what is free: sizing trials, refusing requests, naming holders."""

from __future__ import annotations

import pytest

from airflow_ray_ml_stages.capacity import (
    Capacity, Holder, ResourceRequest, check_request, describe, fit_workers, holders_of, plan_trials, trial_threads,
    waiting_reason,
)
from airflow_ray_ml_stages.probe import cpu_headroom
from airflow_ray_ml_stages.tune import most_at_once


def _capacity(total: float, free: float, holders=(), gpus: float = 0.0, free_gpus: float | None = None,
              autoscaling: bool = False) -> Capacity:
    node = {"CPU": total, **({"GPU": gpus} if gpus else {})}
    return Capacity.of_nodes([{"state": "ALIVE", "resources_total": node}],
                             available={"CPU": free, "GPU": gpus if free_gpus is None else free_gpus},
                             holders=holders, autoscaling=autoscaling)


def _plan(total: float, free: float, threads: int = 1, **kwargs):
    return plan_trials(_capacity(total, free), threads=threads, gpus=kwargs.pop("gpus", 0.0),
                       headroom=cpu_headroom(total), **kwargs)


def test_plan_trials_on_an_idle_two_cpu_cluster_runs_two_one_cpu_trials_as_before():
    plan = _plan(2, 2)
    assert (plan.cpus, plan.max_concurrent, plan.threads) == (1.0, 2, 1)


@pytest.mark.parametrize(("cpus", "at_once"), [(8, 6), (16, 12)])
def test_plan_trials_on_a_large_idle_cluster_runs_one_cpu_trials_beside_ray_datas_headroom(cpus, at_once):
    plan = _plan(cpus, cpus)
    assert (plan.cpus, plan.max_concurrent) == (1.0, at_once)
    assert f"{at_once} at once" in plan.reason


def test_plan_trials_beside_serve_apps_shares_the_free_cpus_in_fractions():
    plan = _plan(2, 1.25)  # three Serve apps hold 0.75
    assert plan.cpus == 0.6 and plan.max_concurrent == 2
    assert "small or busy cluster (1.25 of 2 CPU free)" in plan.reason
    nearly_full = _plan(2, 0.05)
    assert nearly_full.cpus == 0.05 and nearly_full.max_concurrent == 1


def test_plan_trials_takes_the_specs_cpus_and_concurrency_when_given():
    plan = _plan(8, 8, cpus_per_trial=0.5, max_concurrent=2)
    assert (plan.cpus, plan.max_concurrent) == (0.5, 2)
    assert "cpus_per_trial=0.5 set in the spec" in plan.reason and "max_concurrent_trials=2" in plan.reason


def test_plan_trials_with_a_gpu_share_runs_as_many_as_the_free_gpus_hold():
    plan = plan_trials(_capacity(16, 16, gpus=1), threads=1, gpus=0.25, headroom=cpu_headroom(16))
    assert (plan.gpus, plan.max_concurrent) == (0.25, 4)


def test_trial_threads_grow_with_the_data_up_to_the_workers_cpus():
    assert trial_threads(4_500, 13, most=6) == 1
    assert trial_threads(1_000_000, 3, most=6) == 3
    assert trial_threads(10_000_000, 50, most=6) == 6


SERVE_REPLICA = {"state": "ALIVE", "class_name": "ServeReplica:{app}:Model", "job_id": "01000000",
                 "required_resources": {"CPU": 0.25}, "placement_group_id": None}


def test_holders_of_names_serve_apps_and_other_jobs_not_the_own_job_nor_actors_twice():
    actors = [{**SERVE_REPLICA, "class_name": f"ServeReplica:{app}:Model"} for app in ("wine", "rent", "rent")]
    actors += [
        {"state": "ALIVE", "class_name": "TrainWorker", "job_id": "02000000", "required_resources": {"CPU": 1},
         "placement_group_id": "pg1"},  # counted with its group
        {"state": "ALIVE", "class_name": "Scorer", "job_id": "03000000", "required_resources": {"CPU": 0.5}},
        {"state": "DEAD", "class_name": "Gone", "job_id": "03000000", "required_resources": {"CPU": 4}},
        {"state": "ALIVE", "class_name": "Mine", "job_id": "09000000", "required_resources": {"CPU": 1}},
        {"state": "ALIVE", "class_name": "ServeController", "job_id": "01000000", "required_resources": {}},
    ]
    groups = [
        {"state": "CREATED", "creator_job_id": "02000000", "bundles": [{"unit_resources": {"CPU": 1, "GPU": 1}}] * 2},
        {"state": "PENDING", "creator_job_id": "02000000", "bundles": [{"unit_resources": {"CPU": 8}}]},
        {"state": "CREATED", "creator_job_id": "09000000", "bundles": [{"unit_resources": {"CPU": 1}}]},
    ]
    holders = holders_of(actors, groups, {"02000000": "raysubmit_train"}, own_job_id="09000000")
    assert holders == [Holder("job", "raysubmit_train", 2.0, 2.0), Holder("job", "03000000", 0.5),
                       Holder("serve", "rent", 0.5), Holder("serve", "wine", 0.25)]


def test_describe_names_the_serve_apps_the_jobs_and_what_is_free():
    holders = (Holder("serve", "a", 0.5), Holder("job", "raysubmit_x", 0.5), Holder("serve", "b", 0.25),
               Holder("serve", "c", 0.25))
    capacity = _capacity(2, 0.5, holders)
    assert describe(capacity) == "1.5 CPU held by Serve apps a, b, c (1), job raysubmit_x (0.5); 0.5 of 2 CPU free"
    assert describe(_capacity(2, 2)) == "nothing else holds CPU; 2 of 2 CPU free"
    assert waiting_reason(capacity, what="trial", cpus=1).endswith("; each trial needs 1 CPU")


def test_check_request_far_above_a_static_cluster_names_the_numbers_and_the_setting():
    capacity = _capacity(2, 2)
    problem = check_request(capacity, ResourceRequest("training worker", 500, 1.0, setting="num_workers"))
    assert problem.startswith("500 training worker(s) x 1 CPU = 500 CPU, but the cluster has 2 CPU in all")
    assert "Lower num_workers" in problem
    too_big = check_request(capacity, ResourceRequest("trial", 1, 4.0, setting="cpus_per_trial"))
    assert "each trial needs 4 CPU, but no node has that (the largest have 2 CPU)" in too_big
    custom = check_request(capacity, ResourceRequest("entrypoint", 1, 0.0, custom={"TPU": 1}, setting="x"))
    assert "needs 1 TPU" in custom
    assert check_request(capacity, ResourceRequest("training worker", 2, 1.0, setting="num_workers")) is None


def test_check_request_on_an_autoscaling_cluster_or_without_its_nodes_leaves_it_to_wait():
    request = ResourceRequest("training worker", 500, 1.0, setting="num_workers")
    assert check_request(_capacity(2, 2, autoscaling=True), request) is None
    assert check_request(Capacity.of_nodes([]), request) is None


def test_most_at_once_counts_overlapping_spans_and_not_touching_ones():
    assert most_at_once([(0, 10), (1, 5), (2, 3), (6, 9)]) == 3
    assert most_at_once([(0, 1), (1, 2), (2, 3)]) == 1
    assert most_at_once([(0, None), (5, 6)]) == 2
    assert most_at_once([]) == 0


def test_fit_workers_keeps_their_cpus_while_free_and_shares_what_is_free_otherwise():
    assert fit_workers(_capacity(8, 8), 2, 3.0) == (3.0, None)
    cpus, why = fit_workers(_capacity(2, 0.75, (Holder("serve", "a", 1.25),)), 1, 1.0)
    assert cpus == 0.75 and why.startswith("1 worker(s) x 1 CPU do not fit the 0.75 CPU free (1.25 CPU held by Serve app a")
    assert fit_workers(_capacity(2, 0.0), 2, 1.0)[0] == 0.05
