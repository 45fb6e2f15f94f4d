"""What the tests of the wine DAGs share: small run confs, a wine to score, and a run of a DAG through
``dag.test()`` in a child interpreter with its own Airflow configuration."""

from __future__ import annotations

import json
import os
from datetime import datetime
from types import SimpleNamespace

from tests.child import run_python
from tests.conftest import ROOT

ROW = {"fixed acidity": 7.0, "volatile acidity": 0.27, "citric acid": 0.36, "residual sugar": 20.7,
       "chlorides": 0.045, "free sulfur dioxide": 45.0, "total sulfur dioxide": 170.0, "density": 1.001,
       "pH": 3.0, "sulphates": 0.45, "alcohol": 8.8, "type": "white"}
# small settings: a short search over both families and both scalers
SMALL = {"demo_rows": 1500, "demo_seed": 1, "num_trials": 3, "max_epochs": 2, "num_boost_round": 40}
# what a run that tests something other than the search needs of it: one quick XGBoost trial
# one model trained as the train task trains it (no cross-validation, which 1,500 rows would get)
ONE_TRIAL = {"demo_rows": 1500, "demo_seed": 1, "num_trials": 1, "families": ["xgboost"], "num_boost_round": 40,
             "cv_folds": 0}
WINE_APP, WINE_ROUTE = "wine-quality", "/wine"  # where the pipeline serves with its Deploy Params left empty
# a deliberately worse search: one shallow boosting round
WORSE = {"family": "xgboost", "scaler": "standard", "xgboost": {"num_boost_round": 1, "max_depth": 1}}

# dag.test() one run; its run id, its state and the tasks' reported in a file (tests/child.py)
_RUN_DAG = """
import json, sys
from datetime import datetime
from tests.conftest import ROOT, load_dag
dag_id, when, conf = json.loads(sys.argv[1])
when = datetime.fromisoformat(when)
run = load_dag(dag_id, ROOT / "dags").test(logical_date=when, run_after=when, run_conf=conf)
states = {ti.task_id: ti.state for ti in run.get_task_instances()}
result = {"dag_id": dag_id, "run_id": run.run_id, "state": run.state, "states": states}
report(result)
"""


def run_dag_in_child(dag_id: str, when: datetime, conf: dict, env: dict[str, str], timeout_s: float):
    """One run of a DAG of ``dags/`` through ``dag.test()``, in a child interpreter with ``env`` (an
    Airflow setting that is read when the operators are imported, such as lineage or deferrable):
    ``dag_id``, ``run_id``, ``state``, ``states`` and the child's ``output`` (the task logs)."""
    child = run_python(_RUN_DAG, json.dumps([dag_id, when.isoformat(), conf]), cwd=ROOT, env=env, timeout=timeout_s)
    return SimpleNamespace(**child.result, output=child.output)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def asset_events(name: str) -> list[dict]:
    """The extras of the Asset ``name``'s events, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.name == name).order_by(AssetEvent.id).all())
        return [dict(row.extra or {}) for row in rows]


def serve_url() -> str:
    """The session cluster's Serve URL (the ``ray_default`` connection's)."""
    return json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])["extra"]["serve_url"]
