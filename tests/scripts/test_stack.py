"""`make run`'s own steps (scripts/stack.py): the run conf, the label check, and the path on a table that is not wine."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest
import requests

from tests.conftest import ROOT, allow_sources, load_dag, serve_apps_deleted_after_module
from tests.operators.test_ray_job import _xcom

_SPEC = importlib.util.spec_from_file_location("stack", ROOT / "scripts" / "stack.py")
stack = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stack)

RENT_FEATURES = {"sqm", "rooms", "year_built", "district"}


def test_make_run_repeats_the_last_progress_line_of_the_tune_log():
    from airflow_ray_ml_stages.constants import TUNE_PROGRESS_MARKER

    # records as Airflow's log endpoint returns them: the job's lines are streamed in with their prefix
    records = [{"event": "[ray] tuning: 12 sample(s), searcher adaptive", "level": "info"},
               {"event": f"[ray] 2026-12-07 INFO tune.py:390 -- {TUNE_PROGRESS_MARKER}3 of 12 trials ended, "
                         "2 running, 7 to come", "level": "info"},
               "a plain line",
               {"event": f"[ray] {TUNE_PROGRESS_MARKER}5 of 12 trials ended, 2 running, 5 to come; best val_rmse "
                         "so far 0.7 (trial t_1)"}]
    assert stack.last_progress(records) == (f"{TUNE_PROGRESS_MARKER}5 of 12 trials ended, 2 running, 5 to come; "
                                            "best val_rmse so far 0.7 (trial t_1)")
    assert stack.last_progress(records[:1]) is None


def write_rent_table(path, rows: int = 1500, seed: int = 5) -> str:
    """Apartment rents: another label, a categorical feature, values far outside the wine grades."""
    rng = np.random.default_rng(seed)
    per_sqm = {"north": 11.0, "centre": 16.0, "south": 9.0, "harbour": 14.0}
    district = rng.choice(list(per_sqm), rows)
    sqm = rng.uniform(20, 140, rows).round(1)
    rooms = np.clip(np.round(sqm / 30) + rng.integers(-1, 2, rows), 1, 6).astype(int)
    year_built = rng.integers(1900, 2024, rows)
    rent = sqm * np.array([per_sqm[d] for d in district]) + 40 * rooms + 1.5 * (year_built - 1900)
    frame = pd.DataFrame({"sqm": sqm, "rooms": rooms, "year_built": year_built, "district": district,
                          "rent": (rent + rng.normal(0, 80, rows)).round(0)})
    frame.to_csv(path, index=False)
    return str(path)


def test_run_conf_leaves_the_app_to_the_dag_unless_app_is_given(tmp_path):
    source = write_rent_table(tmp_path / "rent.csv", rows=20)
    conf = stack.run_conf({"num_trials": 2}, source=source, label="Monthly Rent")
    # the DAG names the application after the label (tests/dags/test_wine_params.py)
    assert conf == {"num_trials": 2, "source": [source], "label_column": "Monthly Rent"}
    assert stack.run_conf({}, source=source, label="rent", app="flats") == {
        "source": [source], "label_column": "rent", "serve_app": "flats", "serve_route": "/flats"}
    assert stack.run_conf({"serve_app": "mine"}, app="flats")["serve_app"] == "mine"  # the conf wins


def test_check_label_refuses_a_label_that_is_not_a_column_before_any_run(tmp_path):
    source = write_rent_table(tmp_path / "rent.csv", rows=20)
    with pytest.raises(SystemExit, match=r"'quality' is not in .*rent.csv.*'sqm'.*LABEL=<column>"):
        stack.check_label({"source": [source]}, default_label="quality")
    stack.check_label({"source": [source], "label_column": "rent"}, default_label="quality")
    semicolons = tmp_path / "uci.csv"
    semicolons.write_text('"fixed acidity";"quality"\n7.0;5\n')
    assert stack.file_columns(str(semicolons)) == ["fixed acidity", "quality"]


def test_ray_connection_extra_adds_the_sources_to_the_allowed_ones_and_keeps_the_rest(monkeypatch):
    current = {"allowed_sources": "/srv/shared\n/data/rent.csv", "auth_token": "***", "dashboard_url": "http://old:1"}
    extra = stack.ray_connection_extra(current, ["/data/rent.csv", "https://data.example.com/pub/flats.csv"])
    assert extra["allowed_sources"] == ["/srv/shared", "/data/rent.csv", "https://data.example.com/pub/flats.csv"]
    assert extra["auth_token"] == "***"  # sent back redacted, Airflow keeps the stored token
    assert extra["dashboard_url"] == f"http://127.0.0.1:{stack.RAY_DASHBOARD_PORT}"
    assert extra["artifact_root"] == str(ROOT / "artifacts")
    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT", raising=False)
    assert "AIRFLOW_CONN_RAY_DEFAULT" not in stack.airflow_env()  # a variable would hide the database's copy


def _stored_connection_extra(conn_id: str) -> dict:
    """The connection's extra as Airflow's own CLI reads it from the database (decrypted; no variable set)."""
    env = {key: value for key, value in os.environ.items() if key != f"AIRFLOW_CONN_{conn_id.upper()}"}
    done = subprocess.run([sys.executable, "-m", "airflow", "connections", "get", conn_id, "-o", "json"],
                          capture_output=True, text=True, env=env, check=True)
    (connection,) = json.loads(done.stdout)
    return connection["extra_dejson"]


@pytest.mark.integration
def test_keep_ray_connection_on_a_running_api_server_allows_each_runs_sources_in_the_database(
        airflow_db, tmp_path, monkeypatch):
    from tests.plugins.api_server import running_api_server

    first, second = write_rent_table(tmp_path / "rent.csv", rows=20), write_rent_table(tmp_path / "flats.csv", rows=20)
    with running_api_server(tmp_path, AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True") as base:
        monkeypatch.setattr(stack, "AIRFLOW_URL", base)
        connection = f"{base}/api/v2/connections/{stack.RAY_CONN_ID}"
        client = stack.AirflowClient()  # every user is an admin here: no login
        try:
            stack.keep_ray_connection(client, [first])  # the first `make run SOURCE=`: created
            assert json.loads(requests.get(connection, timeout=10).json()["extra"])["allowed_sources"] == [first]
            # a person sets a token and another root in the UI, then `make run SOURCE=flats.csv` runs
            extra = json.loads(requests.get(connection, timeout=10).json()["extra"])
            extra.update(auth_token="s3cret-token", allowed_sources="\n".join([*extra["allowed_sources"], "/srv/shared"]))
            requests.patch(connection, timeout=10, json={"connection_id": stack.RAY_CONN_ID, "conn_type": "ray_ml",
                                                         "extra": json.dumps(extra)}).raise_for_status()
            stack.keep_ray_connection(client, [second])
            stored = _stored_connection_extra(stack.RAY_CONN_ID)
            assert stored["allowed_sources"] == [first, "/srv/shared", second]
            assert stored["auth_token"] == "s3cret-token"  # kept, though the API showed it redacted
        finally:  # other tests find ray_default undefined unless they set it
            requests.delete(connection, timeout=10)


# the rent table's run serves on an application named after its label (stack.run_conf)
delete_own_serve_apps = serve_apps_deleted_after_module("rent")


@pytest.mark.integration
def test_make_run_path_on_a_rent_table_serves_its_own_test_row_and_skips_wine_scoring(
        airflow_db, ray_conn, tmp_path, monkeypatch):
    source = write_rent_table(tmp_path / "rent.csv")
    allow_sources(monkeypatch, source)  # what `make run SOURCE=` adds to the connection
    # the splits are written with the first scaler (standard); the model is trained with another
    search = {"family": "xgboost", "scaler": "minmax", "xgboost": {"num_boost_round": 40}}
    conf = stack.run_conf({"num_trials": 1, "search_space": search, "cv_folds": 0}, source=source, label="rent")
    when = datetime(2026, 5, 20, tzinfo=timezone.utc)
    dag_run = load_dag("wine_quality_pipeline", ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states
    assert states["demo_data"] == "skipped"
    deployed = _xcom(dag_run, "deploy")
    assert deployed["action"] == "promoted" and deployed["endpoint"].endswith("/rent")

    trained = _xcom(dag_run, "train")
    assert trained["config"]["scaler"] == "minmax"
    # the summary speaks of rents: no share within half a wine grade
    summary = stack.model_summary(trained, "rent")
    assert f"test RMSE {trained['metrics']['test']['rmse']:.4g}" in summary and "within" not in summary
    assert "within 0.5: " in stack.model_summary(trained, "quality")  # the demo's grades
    row, label, answer = stack.sample_prediction(deployed["endpoint"], _xcom(dag_run, "preprocess"))
    assert set(row) == RENT_FEATURES and row["district"] in {"north", "centre", "south", "harbour"}
    # decoded to the table's own values, not through the model's other scaler
    assert 20 <= row["sqm"] <= 140 and 1 <= row["rooms"] <= 6 and 1900 <= row["year_built"] <= 2024
    assert answer.status_code == 200, answer.text
    prediction = answer.json()["predictions"][0]
    assert math.isfinite(prediction) and abs(prediction - label) < 0.5 * label  # a rent, not a wine grade

    later = datetime(2026, 5, 21, tzinfo=timezone.utc)
    scoring = load_dag("wine_batch_scoring", ROOT / "dags").test(logical_date=later, run_after=later,
                                                                 run_conf={"serve_app": "rent"})
    scoring_states = {ti.task_id: ti.state for ti in scoring.get_task_instances()}
    assert scoring.state == "success", scoring_states
    assert scoring_states["score"] == "skipped" and scoring_states["new_wines"] == "skipped"
    reason = _xcom(scoring, "pick_input", key="skip_reason")
    assert "sqm" in reason and "`input` Param" in reason


@pytest.mark.parametrize(("cpus", "gpus", "message"), [("0", "", "RAY_CPUS='0'"), ("two", "", "RAY_CPUS='two'"),
                                                       ("", "-1", "RAY_GPUS='-1'"), ("1.5", "", "a whole number")])
def test_cluster_size_refuses_a_size_that_is_not_a_count_naming_it(cpus, gpus, message):
    with pytest.raises(SystemExit, match=message):
        stack.cluster_size(cpus, gpus)


def test_cluster_size_left_empty_leaves_the_size_to_ray():
    # A given size reaching the head: tests/test_localcluster.py starts its long-path stack with
    # cluster_size("3", "0") and checks what the head advertises.
    assert stack.cluster_size("", "") == [] and stack.cluster_size(" ", "") == []


def test_the_leaderboard_report_shows_an_ensemble_by_its_members(tmp_path, capsys):
    """make run's report of the search: an ensemble's row (no scaler, members as its config) prints like a trial's."""
    rows = [{"rank": 1, "trial_id": "ensemble", "family": "ensemble", "scaler": None, "status": "COMPLETED",
             "metrics": {"val_rmse": 0.61, "val_mae": 0.47},
             "config": {"family": "ensemble", "members": [
                 {"trial_id": "a_00001", "family": "xgboost", "weight": 0.6667},
                 # a cross-validated trial: its fold models' weights add up
                 *({"trial_id": "a_00003", "family": "linear", "weight": 0.3333 / 3, "fold": fold}
                   for fold in range(3))]}},
            {"rank": 2, "trial_id": "a_00001", "family": "extra_trees", "scaler": "standard", "status": "COMPLETED",
             "metrics": {"val_rmse": 0.64, "val_mae": 0.49}, "config": {"family": "extra_trees", "n_estimators": 100}}]
    (tmp_path / "leaderboard.json").write_text(json.dumps(rows))
    stack.print_leaderboard({"leaderboard_json_uri": str(tmp_path / "leaderboard.json"), "metric": "val_rmse",
                             "trials": {"total": 1, "completed": 1}, "scheduler": "asha", "time_s": 3.0,
                             "leaderboard_csv_uri": "l.csv", "plot_uri": "l.png"})
    lines = capsys.readouterr().out.splitlines()
    ensemble = next(line for line in lines if "ensemble" in line)
    assert ensemble.split()[:4] == ["1", "ensemble", "-", "0.6100"]
    assert ensemble.endswith("a_00001 (xgboost) x 0.67, a_00003 (linear, 3 folds) x 0.33"), ensemble
    assert next(line for line in lines if "extra_trees" in line).split()[:3] == ["2", "extra_trees", "standard"]



@pytest.mark.integration
def test_airflow_as_make_run_starts_it_listens_on_loopback_only_and_stops_on_one_sigint(tmp_path):
    """`up` runs `stack.py airflow` as its session's leader: the database migrated, then the components
    `airflow standalone` runs, without the log servers Airflow binds on every interface (8793, 8794).
    Here on a database of its own and an empty DAG folder, on free ports."""
    import signal
    import time

    from scripts import localcluster
    from tests.plugins.api_server import wait_until_healthy
    from tests.test_localcluster import _cmdline, _listening_beyond_loopback, _running

    port = localcluster.free_port()
    home, dags = tmp_path / "home", tmp_path / "dags"
    home.mkdir(), dags.mkdir()
    env = {key: value for key, value in stack.airflow_env().items()
           if not key.startswith("AIRFLOW__DATABASE") and key != "AIRFLOW_CONN_RAY_DEFAULT"}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__API__PORT=str(port),
               AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
               AIRFLOW__CORE__PARALLELISM="1",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
               AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(localcluster.free_port()),
               AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(localcluster.free_port()))
    log_path = tmp_path / "airflow.log"
    with open(log_path, "wb") as log:
        leader = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "stack.py"), "airflow"], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    try:
        wait_until_healthy(leader, f"http://127.0.0.1:{port}", log_path, timeout_s=240)  # migrated, then started
        session = localcluster.session_pids(leader.pid)
        commands = [_cmdline(pid) for pid in session]
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):  # by command or process title
            assert any(f"airflow {name}" in command for command in commands
                       for name in (component, component.replace("-", "_"))), commands
        time.sleep(10)  # the scheduler and the triggerer would have bound their log servers by now
        session = localcluster.session_pids(leader.pid)
        assert _listening_beyond_loopback(session) == set()
        assert not any(_cmdline(pid).startswith("airflow serve-logs") for pid in session)  # its process title
    finally:
        killed = localcluster.stop_session(leader.pid, grace_s=60, sig=signal.SIGINT)
    assert killed == 0 and _running(session) == [], [_cmdline(pid) for pid in _running(session)]
