"""The Ray side of ``@task.ray``: ``python -m airflow_ray_ml_stages.task_function`` calls the function
from its own module and publishes its JSON return value, or its error, as the job's manifest."""

from __future__ import annotations

import json
import re
import sys
from datetime import date

import pytest

from airflow_ray_ml_stages.constants import ARTIFACT_DIR_ENV, MANIFEST_LOG_MARKER
from airflow_ray_ml_stages.task_function import json_problem, main

MODULE = '''
def totals(rows, scale=1.0):
    print("summing", rows)
    return {"total": sum(range(rows)) * scale, "pair": (1, 2)}


def dated():
    import datetime
    return {"when": datetime.date(2026, 1, 1)}


def broken(table):
    raise ValueError(f"{table}: column 'price' has text 'n/a' in row 2")
'''


def _run(function: str, arguments: object, tmp_path, monkeypatch, capsys) -> tuple[int, dict, str]:
    (tmp_path / "rayml_task_sample.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rayml_task_sample", raising=False)  # each test imports its own copy
    monkeypatch.setenv(ARTIFACT_DIR_ENV, str(tmp_path / "run"))
    code = main(["--module", "rayml_task_sample", "--function", function, "--arguments", json.dumps(arguments)])
    out = capsys.readouterr().out
    manifest = json.loads(next(line for line in out.splitlines() if line.startswith(MANIFEST_LOG_MARKER))
                          [len(MANIFEST_LOG_MARKER):])
    assert json.loads((tmp_path / "run" / "manifest.json").read_text()) == manifest
    return code, manifest, out


def test_json_problem_names_where_a_value_is_not_json():
    assert json_problem({"a": [1, "x", None, 2.5, (True,)]}, "value") is None
    assert json_problem({"a": [1, {2: "x"}]}, "value") == ("value['a'][1] has the key 2, a int, where JSON takes "
                                                          "only text keys")
    assert json_problem([date(2026, 1, 1)], "args") == "args[0] is a datetime.date, which is not JSON"


def test_main_with_a_json_return_value_publishes_it_as_the_manifest(tmp_path, monkeypatch, capsys):
    code, manifest, out = _run("totals", {"args": [4], "kwargs": {"scale": 0.5}}, tmp_path, monkeypatch, capsys)
    assert code == 0 and "summing 4" in out
    assert manifest["status"] == "succeeded" and manifest["return_value"] == {"total": 3.0, "pair": [1, 2]}


def test_main_with_a_raising_function_prints_its_traceback_and_may_be_retried(tmp_path, monkeypatch, capsys):
    code, manifest, out = _run("broken", {"args": ["sales.csv"]}, tmp_path, monkeypatch, capsys)
    assert code == 1 and "Traceback (most recent call last):" in out and 'raise ValueError(f"{table}' in out
    assert manifest["error"] == "ValueError: sales.csv: column 'price' has text 'n/a' in row 2"
    assert manifest["status"] == "failed" and manifest["retryable"] is True


@pytest.mark.parametrize(("function", "arguments", "error"), [
    ("dated", {}, r"the return value of dated\(\)\['when'\] is a datetime.date, which is not JSON: return numbers"),
    ("missing", {}, "the function's module rayml_task_sample did not reach the job"),
    ("totals", [4], r'the arguments must be \{"args": \[...\], "kwargs": \{...\}\}'),
])
def test_main_with_what_no_retry_can_fix_fails_not_retryable(function, arguments, error, tmp_path, monkeypatch,
                                                             capsys):
    code, manifest, _ = _run(function, arguments, tmp_path, monkeypatch, capsys)
    assert code == 1 and manifest["retryable"] is False
    assert re.search(error, manifest["error"]), manifest["error"]
