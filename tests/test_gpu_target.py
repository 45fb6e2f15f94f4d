"""`make test-gpu` on a GPU host: the runtime, the `ml` extra and pytest (the `test-gpu` extra) suffice.

Such a host has none of the CPU suite's browser, S3 server, fuzzing or packaging packages, and
none of their pytest plugins: the suite must still collect its gpu tests there.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.conftest import ROOT
from tests.hidden_packages import hiding_env

# what the dev extra adds beyond test-gpu, by import name
DEV_ONLY = ["playwright", "schemathesis", "hypothesis", "_hypothesis_pytestplugin", "build", "pytest_randomly", "xdist"]


@pytest.mark.harness
def test_gpu_tests_collect_without_the_cpu_suites_packages(tmp_path):
    env = hiding_env(DEV_ONLY, tmp_path / "hide")
    # no plugin loads by entry point: those of the hidden packages are not installed on the host
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "pytest_timeout",
         "-p", "no:cacheprovider", str(ROOT / "tests")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert "tests/operators/test_ray_train.py::test_train_lightning_gpu_spec_trains_on_the_gpu" in collected
    assert any(line.startswith("tests/operators/test_gpu_probe.py::") for line in collected)


def test_gpu_extra_is_pytest_alone_and_the_dev_extra_builds_on_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {requirement.split(">")[0].split("=")[0] for requirement in extras["test-gpu"]}
    assert names == {"pytest", "pytest-timeout"}
    assert "airflow-ray-ml[test-gpu]" in extras["test"] and "airflow-ray-ml[test]" in extras["dev"]
