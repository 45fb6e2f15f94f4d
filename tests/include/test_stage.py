"""The shared stage entry point: manifests on success, failed manifests and exit 1 on any error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import MANIFEST_LOG_MARKER
from airflow_ray_ml_stages.generate import main as generate_main
from tests.conftest import ROOT

# This checkout's airflow_ray_ml_stages, not whichever one the interpreter has installed (an editable install of another).
CHECKOUT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include")])}


def _spec(tmp_path, **fields) -> str:
    return json.dumps({"artifact_dir": str(tmp_path / "run"), **fields})


def test_stage_success_writes_manifest_with_result(tmp_path, capsys):
    assert generate_main(["--spec", _spec(tmp_path, rows=300, seed=1, file_format="csv")]) == 0
    manifest = artifacts.read_json(str(tmp_path / "run" / "manifest.json"))
    assert manifest["status"] == "succeeded" and manifest["stage"] == "generate"
    assert manifest["rows"] == 300 and manifest["duration_s"] >= 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(MANIFEST_LOG_MARKER)]
    assert json.loads(printed[-1][len(MANIFEST_LOG_MARKER):]) == manifest


def test_stage_invalid_spec_writes_failed_manifest_and_exits_1(tmp_path):
    assert generate_main(["--spec", _spec(tmp_path, rows=-5)]) == 1
    manifest = artifacts.read_json(str(tmp_path / "run" / "manifest.json"))
    assert manifest["status"] == "failed"
    assert "rows must be an integer >= 2, got -5" in manifest["error"]
    assert manifest["retryable"] is False  # the same spec fails the same way: the task fails at once


def test_stage_runtime_error_writes_failed_manifest(tmp_path):
    blocker = tmp_path / "run"
    blocker.mkdir()
    (blocker / "winequality-red.csv").mkdir()  # a directory where the stage wants to write a file
    assert generate_main(["--spec", _spec(tmp_path, rows=300)]) == 1
    manifest = artifacts.read_json(str(blocker / "manifest.json"))
    assert manifest["status"] == "failed" and manifest["error"]
    assert manifest["retryable"] is True  # not an error of ours: another try may pass


def test_stage_runs_as_module_with_exit_code(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "airflow_ray_ml_stages.generate", "--spec", _spec(tmp_path, rows=100)],
                        capture_output=True, text=True, env=CHECKOUT_ENV)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "airflow_ray_ml_stages.generate", "--spec", "not json"],
                         capture_output=True, text=True, env=CHECKOUT_ENV)
    assert bad.returncode == 1 and "not valid JSON" in bad.stdout


@pytest.mark.parametrize("stage, spec_type", [("generate", "GenerateSpec"), ("probe", "ProbeSpec"),
                                              ("data", "PreprocessSpec"), ("train", "TrainSpec"),
                                              ("tune", "TuneSpec"), ("score", "ScoreSpec")])
def test_every_stage_runs_as_python_dash_m(stage, spec_type):
    """``python -m airflow_ray_ml_stages.<stage>`` (what a Ray job runs) reaches that stage's entry point."""
    done = subprocess.run([sys.executable, "-m", f"airflow_ray_ml_stages.{stage}", "--spec", "not json"],
                          capture_output=True, text=True, env=CHECKOUT_ENV, timeout=120)
    assert done.returncode == 1 and f"{spec_type} spec is not valid JSON" in done.stdout, done.stdout + done.stderr
