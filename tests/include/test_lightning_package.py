"""Lightning under either package name: models/lightning_package.py decides as Ray does, every path
trains with both packages installed and with ``lightning`` hidden (a Ray Train worker with both:
test_ray_train.py's killed-worker Lightning run), and training errors a retry cannot fix fail the
task once (train/failures.py)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import ClusterError, SpecError, TrainingError
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.train.failures import not_retryable
from tests.child import run_python
from tests.conftest import ROOT, load_dag, requires_ml_extra, skip_without_ml_extra
from tests.hidden_packages import hiding_env
from tests.operators.test_ray_job import _jobs_of, _xcom
from tests.train_data import write_preprocessed, write_splits

LOGICAL_DATE = datetime(2026, 7, 1, tzinfo=timezone.utc)
# this checkout's packages first, in every subprocess (the tests' own sys.path is not inherited)
CHECKOUT_PATH = os.pathsep.join([str(ROOT), str(ROOT / "include")])
# what the suite's environment has (the dev extra installs both), and the same with `lightning` hidden
PACKAGE_CASES = [pytest.param([], "lightning.pytorch", id="both_installed"),
                 pytest.param(["lightning"], "pytorch_lightning", id="lightning_hidden")]


def _env(hidden: list[str], directory: Path) -> dict[str, str]:
    env = hiding_env(hidden, directory) if hidden else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), CHECKOUT_PATH]))
    env.pop("RAY_ADDRESS", None)
    return env


def _python(code: str, env: dict[str, str], *args: str):
    """What ``code`` reports (tests/child.py), run with ``args`` in a child with ``env``."""
    return run_python(code, *args, env=env, timeout=300).result


# One fresh process per package case does what each test below checks, in the order a job does it:
# what it can import, which package import_lightning takes beside Ray's Lightning classes, and a
# training run in the job's own process (Train's local mode without Ray, early stopping on). Each
# such process spends seconds importing torch, Lightning and Ray; the tests share them.
FRESH_PROCESS = """\
import importlib, importlib.util, sys
def imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        return False
    return True
found = importlib.util.find_spec('lightning') is not None
imported = [found, *(imports(name) for name in ('lightning', 'lightning.pytorch', 'pytorch_lightning', 'torch'))]
from airflow_ray_ml_stages.models.lightning_package import import_lightning
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback
pl = import_lightning()
chosen = [pl.__name__, issubclass(RayDDPStrategy, pl.strategies.Strategy), issubclass(RayTrainReportCallback, pl.Callback),
          issubclass(RayLightningEnvironment, pl.plugins.environments.ClusterEnvironment)]
from airflow_ray_ml_stages.specs import TrainSpec
from airflow_ray_ml_stages.train.stage import run_training
result = run_training(TrainSpec.from_json(sys.argv[1]))
report({"imported": imported, "chosen": chosen, "result": result.to_dict()})
"""


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """``fresh_process(hidden)``: what a fresh process with ``hidden`` packages hidden reports (above),
    run once per case on first use, with the splits it trained on."""
    skip_without_ml_extra()
    reports: dict[tuple[str, ...], dict] = {}

    def reported(hidden: list[str]) -> dict:
        key = tuple(hidden)
        if key not in reports:
            directory = tmp_path_factory.mktemp("fresh-process")
            fields = write_splits(directory / "splits", rows=1200, seed=5)
            spec = {**fields, "artifact_dir": str(directory / "train"),
                    "config": {"family": "lightning", "max_epochs": 2, "patience": 2, "hidden_sizes": [8]}}
            reports[key] = {**_python(FRESH_PROCESS, _env(hidden, directory / "hide"), json.dumps(spec)),
                            "splits": fields, "artifact_dir": spec["artifact_dir"]}
        return reports[key]

    return reported


@pytest.mark.parametrize("hidden, expected", PACKAGE_CASES)
def test_import_lightning_takes_the_package_rays_lightning_classes_come_from(fresh_process, hidden, expected):
    assert fresh_process(hidden)["chosen"] == [expected, True, True, True]


def test_hidden_package_cannot_be_imported_while_the_others_can(fresh_process):
    # found by find_spec; imports lightning, lightning.pytorch, pytorch_lightning, torch
    assert fresh_process(["lightning"])["imported"] == [False, False, False, True, True]
    assert fresh_process([])["imported"] == [True, True, True, True, True]


@pytest.mark.parametrize("hidden, expected", PACKAGE_CASES)
def test_in_process_lightning_training_records_the_package_it_used(fresh_process, hidden, expected):
    """The job's own process: trains with either package, and the model card says which one."""
    result = fresh_process(hidden)["result"]
    assert result["training"]["runner"] == "in_process" and result["training"]["epochs_run"] == 2
    versions = ModelCard.read(result["model_dir"]).framework_versions
    other = {"lightning.pytorch", "pytorch_lightning"} - {expected}
    assert versions[expected] == "2.6.6" and not other & set(versions) and versions["torch"]
    assert "framework_versions" not in result["training"]  # said once, in the card


def test_trained_lightning_model_loads_and_predicts_without_either_lightning_package(fresh_process, tmp_path):
    """Loading and serving need torch only: the model directory holds a state_dict and its config."""
    trained = fresh_process([])
    code = ("import sys\n"
            "import numpy as np, pandas as pd\n"
            "from airflow_ray_ml_stages.models import load_model\n"
            "model = load_model(sys.argv[1])\n"
            "test = pd.read_parquet(sys.argv[2])[model.card.feature_columns].to_numpy(np.float32)\n"
            "report([model.predict(test).tolist(), sorted(m for m in sys.modules if 'lightning' in m)])\n")
    predicted, loaded = _python(code, _env(["lightning", "pytorch_lightning"], tmp_path / "hide"),
                                trained["result"]["model_dir"], trained["splits"]["test_uri"])
    with np.load(Path(trained["artifact_dir"]) / "evaluation" / "test.npz", allow_pickle=False) as saved:
        np.testing.assert_allclose(predicted, saved["y_pred"], rtol=1e-5, atol=1e-5)
    assert loaded == []


# -- errors a retry cannot fix -------------------------------------------------------------------


def _worker_group_error(failures: dict[int, Exception]):
    from ray.train import WorkerGroupError

    return WorkerGroupError("\n".join(f"rank {rank}: {error!r}" for rank, error in failures.items()), failures)


def test_not_retryable_every_worker_raising_value_or_type_errors_names_ranks_and_cause():
    error = _worker_group_error({0: ValueError("You selected an invalid strategy name"), 1: TypeError("bad")})
    final = not_retryable(error)
    assert isinstance(final, TrainingError) and final.retryable is False
    assert str(final).startswith("training failed on Ray Train worker rank(s) [0, 1] with ValueError: "
                                 "You selected an invalid strategy name; another try would fail the same way")


def test_not_retryable_a_lost_worker_or_a_retryable_error_stays_retryable():
    from ray.exceptions import ActorDiedError

    assert not_retryable(_worker_group_error({0: ValueError("bad"), 1: ActorDiedError()})) is None
    assert not_retryable(_worker_group_error({0: ClusterError("the head went away")})) is None
    assert not_retryable(RuntimeError("connection reset")) is None
    assert not_retryable(_worker_group_error({})) is None  # nothing known about the cause


def test_not_retryable_an_error_of_the_job_itself_keeps_its_type_in_the_message():
    final = not_retryable(SpecError("x must be positive"))
    assert isinstance(final, TrainingError) and str(final).startswith("training failed with SpecError: x must be")
    long = not_retryable(ValueError("y" * 5000))
    assert len(str(long)) < 1000 and "y ..." in str(long)


@requires_ml_extra
def test_train_stage_value_error_in_process_writes_a_not_retryable_manifest(tmp_path):
    from airflow_ray_ml_stages.train.stage import main

    fields = write_splits(tmp_path / "splits", rows=600, seed=5)
    spec = {**fields, "artifact_dir": str(tmp_path / "train"),
            "config": {"family": "xgboost", "num_boost_round": 5, "tree_method": "no_such_method"}}
    assert main(["--spec", json.dumps(spec)]) == 1
    manifest = artifacts.read_json(artifacts.manifest_uri(str(tmp_path / "train")))
    assert manifest["status"] == "failed" and manifest["retryable"] is False
    assert manifest["error"].startswith("TrainingError: training failed with XGBoostError: ")
    assert "no_such_method" in manifest["error"]


# -- the whole path on a real cluster: Tune trials, then Ray Train -----------------------------


@pytest.fixture(scope="module")
def preprocess(tmp_path_factory) -> dict:
    return write_preprocessed(tmp_path_factory.mktemp("lightning-data"), rows=2000, seed=13)


@pytest.mark.integration
def test_lightning_search_then_ray_train_pass_with_lightning_hidden(airflow_db, ray_conn, preprocess, tmp_path):
    """The jobs' every process (driver, Tune trials, Ray Train worker) lacks ``lightning``: Ray's
    classes and the models come from ``pytorch_lightning``. With both packages installed, as in the
    suite's environment, Ray Train workers are test_ray_train.py's killed-worker Lightning run, and
    in-process training (what a Tune trial does) test_in_process_lightning_training_records_the_package_it_used."""
    expected = "pytorch_lightning"
    # Every process of the jobs starts with the hiding sitecustomize on its PYTHONPATH, which Ray puts
    # in front of the node's own: on the session's cluster, as on a cluster whose image lacks the package.
    directory = hiding_env(["lightning"], tmp_path / "hide", env={})["PYTHONPATH"]
    conf = {"preprocess": preprocess, "runtime_env": {"env_vars": {"PYTHONPATH": directory}}}
    dag_run = load_dag("lightning_hidden").test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE, run_conf=conf)
    assert dag_run.state == "success", {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    tune = _xcom(dag_run, "tune")
    assert tune["trials"]["completed"] == 2 and tune["trials"]["failed"] == 0
    trial_card = ModelCard.read(tune["best_checkpoint_uri"])
    train = _xcom(dag_run, "train")
    assert train["training"]["runner"] == "ray_train" and train["compute_used"]["num_workers"] == 1
    assert train["training"]["epochs_run"] == 3
    assert train["metrics"]["test"]["rmse"] < train["baseline"]["test_rmse"]
    assert trial_card.trial_id == tune["best_trial_id"]
    for card in (ModelCard.read(train["model_dir"]), trial_card):
        assert card.framework_versions[expected] == "2.6.6", card.framework_versions
        assert not ({"lightning.pytorch", "pytorch_lightning"} - {expected}) & set(card.framework_versions)


@pytest.mark.integration
def test_train_worker_value_error_fails_the_task_once_with_the_cause(airflow_db, ray_conn, artifact_root, preprocess):
    from airflow_ray_ml.hooks.ray import RayHook
    from airflow_ray_ml.job_status import base_submission_id

    dag_id = "train_refused_on_the_worker"
    dag_run = load_dag(dag_id).test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE,
                                    run_conf={"preprocess": preprocess})
    (ti,) = dag_run.get_task_instances()
    assert dag_run.state == "failed" and ti.state == "failed" and ti.try_number == 1  # it had 2 retries left
    (job,) = _jobs_of(RayHook(), base_submission_id(dag_id, dag_run.run_id, "train"))
    assert job["status"] == "FAILED"
    artifact_dir = artifacts.run_dir(artifact_root, dag_id, dag_run.run_id, "train", -1)
    manifest = artifacts.read_json(artifacts.manifest_uri(artifact_dir))
    assert manifest["retryable"] is False
    assert manifest["error"].startswith(
        "TrainingError: training failed on Ray Train worker rank(s) [0] with XGBoostError: ")
    assert "no_such_method" in manifest["error"]
