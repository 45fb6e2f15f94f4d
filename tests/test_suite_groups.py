"""How `make test` shares its two pytest-xdist workers out (tests/conftest.py): the modules that read
the same expensive session fixture run in one worker, every other module is a group of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, dispatch_key, xdist_groups


def test_modules_asking_for_a_shared_fixture_share_a_group_transitively_and_the_rest_stay_apart():
    groups = xdist_groups({
        "a.py": {"wine_regression", "tmp_path"},
        "b.py": {"wine_regression"},
        "c.py": {"trained_models"},
        "d.py": {"served_champion", "s3_server"},
        "e.py": {"trained_models", "served_champion"},  # joins c's group with d's
        "f.py": {"s3_server"},
        "g.py": {"tmp_path", "ray_conn"},  # a session fixture every integration test reads: no group
    })
    assert groups["a.py"] == groups["b.py"] != groups["c.py"]
    assert groups["c.py"] == groups["d.py"] == groups["e.py"] == groups["f.py"]
    assert groups["g.py"] == "g.py" and len(set(groups.values())) == 3


def test_the_groups_go_out_longest_first_shared_then_integration_then_the_rest_in_their_order():
    groups = xdist_groups({"unit.py": {"tmp_path"}, "job.py": {"ray_conn"}, "a.py": {"trained_models"},
                           "unit2.py": set(), "b.py": {"trained_models"}, "job2.py": {"ray_conn"}})
    modules = ["unit.py", "job.py", "a.py", "unit2.py", "job2.py", "b.py"]  # as randomly collected
    ordered = sorted(modules, key=dispatch_key(groups, integration_groups={"job.py", "job2.py", groups["a.py"]}))
    assert ordered == ["a.py", "b.py", "job.py", "job2.py", "unit.py", "unit2.py"]


@pytest.mark.harness
def test_two_workers_run_each_test_under_its_modules_group():
    """pytest-xdist reads the groups into the test ids when a worker collects: ours must be set first,
    or every test is scheduled alone and a module's fixtures run in both workers."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "RAYML_TEST_RUN",
                           "RAYML_TEST_AIRFLOW_HOME", "PYTEST_ADDOPTS")}
    selected = ["tests/test_docs.py", "tests/test_suite_groups.py::"
                "test_modules_asking_for_a_shared_fixture_share_a_group_transitively_and_the_rest_stay_apart"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-rA",
                           "-p", "no:cacheprovider", *selected], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(passed) >= 2, done.stdout[-3000:]
    for test_id in passed:  # (a parametrized test's id is shown with its group inside the brackets)
        module = test_id.split("::")[0]
        assert f"@{module}" in test_id, test_id
