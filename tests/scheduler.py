"""Airflow's real scheduler on the test metadata DB, for the tests that need a run it starts."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def pause_all_but(dag_id: str) -> None:
    """Pause every other DAG in the test DB and unpause ``dag_id``: a scheduler runs only that DAG's
    runs, not (say) the wine DAG's weekly run, which a browser test may have unpaused through the
    trigger form."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id != dag_id).update({DagModel.is_paused: True})
        session.query(DagModel).filter(DagModel.dag_id == dag_id).update({DagModel.is_paused: False})


@contextlib.contextmanager
def running_scheduler(log_path: Path, dag_id: str, execution_api: str, **env: str):
    """Airflow's scheduler with the LocalExecutor on the test DB, scheduling only ``dag_id``; its tasks
    talk to the API server at ``execution_api`` (``env``: more settings, such as its JWT secret).
    Its output goes to ``log_path``; it is stopped, with its process group, on the way out."""
    pause_all_but(dag_id)
    environment = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "include"), os.environ.get("PYTHONPATH", "")]),
                   "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__PARALLELISM": "2",
                   "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{execution_api}/execution/", **env}
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "airflow", "scheduler"], env=environment, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
