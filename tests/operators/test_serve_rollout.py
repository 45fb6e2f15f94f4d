"""A challenger tried on live traffic before promotion: shadow, canary, and a person's approval.

The deploys run the real operator through ``dag.test()`` against the session's local Ray cluster,
while 16 client threads send real HTTP requests to the application; the approval is answered
through Airflow's own HITL REST API of a real api-server sharing the test database.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest
import requests

from airflow_ray_ml.hooks.ray import RayHook
from airflow_ray_ml.serve_rollout import Rollout, live_metrics, verdict
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import TEST_PREDICTIONS_NAME
from airflow_ray_ml_stages.rollout import RolloutStats, ShareTaker, row_key, row_keys
from tests.conftest import load_dag, requires_ml_extra, serve_apps_deleted_after_module, xcom

CLIENTS = 16
# each client's pause after an answer: the 16 still overlap every reconfiguration of a trial, at
# about 60 requests a second; back to back they sent about 200, and the module spent a sixth of its
# CPU (170 CPU-s in all) answering requests no assertion needed
CLIENT_PAUSE_S = 0.2
_RUNS = iter(range(1, 1000))
delete_own_serve_apps = serve_apps_deleted_after_module("wine-rollout", "wine-canary", "wine-approval")


# -- what the application counts, and the verdict (no cluster) -----------------------------------


@pytest.mark.parametrize("share", [1.0, 0.5, 0.1, 0.25, 0.03])
def test_share_taker_takes_exactly_its_share_spread_evenly(share):
    taker = ShareTaker(share)
    taken = [taker.take() for _ in range(1000)]
    assert sum(taken) == round(1000 * share)
    # spread evenly: every run of ceil(1/share) calls holds one taken
    window = math.ceil(1 / share)
    assert all(sum(taken[start:start + window]) >= 1 for start in range(0, 1000 - window, window))


def test_row_key_is_one_value_for_equal_numbers_and_differs_for_other_rows():
    import numpy as np

    assert row_key([7, "red", True, None]) == row_key([7.0, "red", np.bool_(True), float("nan")])
    assert row_key([np.float32(0.5), "red"]) == row_key([0.5, "red"])
    assert row_key([7.0, "red"]) != row_key([7.0, "white"]) != row_key([7.1, "white"])


def _stats(mode: str = "shadow", classification: bool = False) -> RolloutStats:
    return RolloutStats(mode, 1.0, "v2", classification, kept_rows=3)


def test_stats_compare_regression_answers_and_keep_rows_up_to_their_limit():
    stats = _stats()
    stats.add_champion({"requests": 4, "failures": 0, "answer_ms": [2.0, 2.0, 4.0, 4.0]})
    stats.add_answer(["a", "b"], {"predictions": [5.0, 6.0]}, 3.0, {"predictions": [5.0, 7.0]})
    # two requests mirrored together in one call
    stats.add_answer(["c", "d"], {"predictions": [4.0, 4.0]}, 5.0, {"predictions": [4.0, 4.0]}, requests=2)
    summary = stats.summary(with_rows=True)
    assert summary["compared_rows"] == 4 and summary["challenger"]["requests"] == 3
    assert summary["mean_abs_difference"] == pytest.approx(0.25)
    assert [row[0] for row in summary["rows"]] == ["a", "b", "c"]  # kept_rows=3
    assert summary["champion"]["answer_ms"]["p50"] == pytest.approx(3.0)
    assert summary["challenger"]["answer_ms"]["p50"] == pytest.approx(4.0)
    assert "rows" not in stats.summary()
    # a canary's answer: rows answered, nothing compared
    stats.add_answer([], {"predictions": [1.0, 2.0, 3.0]}, 2.0, None)
    assert (stats.summary()["challenger"]["rows"], stats.summary()["compared_rows"]) == (7, 4)


def test_stats_compare_classes_and_count_failures():
    stats = _stats(classification=True)
    champion = {"predictions": ["x", "y"], "probabilities": [[0.9, 0.1], [0.2, 0.8]], "classes": ["x", "y"]}
    stats.add_answer(["a", "b"], {"predictions": ["x", "x"], "probabilities": [[0.8, 0.2], [0.6, 0.4]],
                                  "classes": ["x", "y"]}, 1.0, champion)
    stats.add_failure(3, "ValueError: broken", requests=2)
    summary = stats.summary()
    assert summary["agreement"] == 0.5
    assert summary["predictions"] == {"champion": {"x": 0.5, "y": 0.5}, "challenger": {"x": 1.0}}
    assert (summary["challenger"]["failures"], summary["challenger"]["requests"]) == (2, 3)
    assert summary["last_failure"] == "ValueError: broken"


def _gate(mine, theirs):
    return mine < theirs, f"challenger rmse {mine} vs champion {theirs}"


def _seen(requests_=100, failures=0, champion_failures=0, mine_ms=2.0, theirs_ms=2.0, compared=300) -> dict:
    return {"challenger": {"requests": requests_, "rows": requests_, "failures": failures, "answer_ms": {"p50": mine_ms}},
            "champion": {"requests": 100, "failures": champion_failures, "answer_ms": {"p50": theirs_ms}},
            "compared_rows": compared}


@pytest.mark.parametrize(("seen", "live", "action", "words"), [
    (None, None, "roll_back", "never reported"),
    (_seen(failures=5), None, "roll_back", "failed 5 of 100"),
    (_seen(failures=5, champion_failures=5), None, "promote", "no failures beyond"),
    (_seen(mine_ms=9.0), None, "keep", "4.5x the champion's"),
    (_seen(), {"rows": 50, "metric": "rmse", "challenger": 0.9, "champion": 0.7}, "keep", "50 labelled live rows"),
    (_seen(), {"rows": 50, "metric": "rmse", "challenger": 0.6, "champion": 0.7}, "promote", "50 labelled live rows"),
    (_seen(), {"rows": 5, "metric": "rmse", "challenger": 0.9, "champion": 0.7}, "promote", "too few to decide"),
    (_seen(requests_=0), None, "promote", "the test metrics decide"),
])
def test_verdict_rolls_back_keeps_or_promotes_and_says_why(seen, live, action, words):
    got, why = verdict(seen, Rollout(mode="shadow", max_error_rate=0.01, max_latency_ratio=2.0), live, _gate)
    assert got == action and words in why, why


def test_a_canary_failing_beyond_the_allowed_rate_is_done_early():
    canary = Rollout(mode="canary", rows=1000)
    assert canary.done(_seen(requests_=30, failures=30))
    assert not canary.done(_seen(requests_=30, failures=0))
    assert not canary.done(_seen(requests_=10, failures=10))  # too few requests to judge
    assert Rollout(mode="shadow", rows=300).done(_seen(compared=300))


@pytest.mark.parametrize(("settings", "words"), [
    ({"mode": "blue-green"}, "rollout must be one of"),
    ({"mode": "shadow", "share": 0}, "rollout_share"),
    ({"mode": "shadow", "share": 1.5}, "rollout_share"),
    ({"mode": "canary", "rows": 0}, "rollout_rows"),
    ({"mode": "canary", "max_latency_ratio": 0.5}, "max_latency_ratio"),
])
def test_rollout_settings_out_of_range_say_what_to_fix(settings, words):
    from airflow_ray_ml.errors import InvalidSpecError

    with pytest.raises(InvalidSpecError, match=words):
        Rollout(**settings)


def test_live_metrics_score_both_models_on_the_labelled_rows_only():
    import pandas as pd

    columns = ["x", "colour", "balcony"]
    # the rows as clients sent them (JSON booleans), keyed as the application keys them
    sent = pd.DataFrame({"x": [1.0, 2.0, 3.0], "colour": ["red", "red", "white"], "balcony": [True, False, True]})
    stats = {"rows": [[key, 10.0, 11.0] for key in row_keys(sent, columns, ["balcony"])]}
    # the label file, as a table holds them: integers, and yes/no for the boolean
    labels = pd.DataFrame({"x": [1, 3, 9], "colour": ["red", "white", "red"], "balcony": ["yes", "Yes", "no"],
                           "quality": [10.0, 12.0, 5.0]})
    live = live_metrics(stats, labels, "quality", columns, ["balcony"], None, "mae")
    assert live["rows"] == 2  # the third label names a row no client sent
    assert live["champion"] == pytest.approx(1.0) and live["challenger"] == pytest.approx(1.0)
    labels.loc[0, "balcony"] = "no"  # no longer the row sent
    assert live_metrics(stats, labels, "quality", columns, ["balcony"], None, "mae")["rows"] == 1
    with pytest.raises(Exception, match="lacks the columns"):
        live_metrics(stats, labels.drop(columns=["quality"]), "quality", columns, ["balcony"], None, "mae")


def test_the_approval_form_reads_as_sentences_with_like_beside_like_and_what_good_looks_like():
    from airflow_ray_ml.serve_approval import evidence_body

    summary = {"challenger_version": "xgb-2", "champion_version": "xgb-1", "metric": "rmse", "challenger": 0.6571,
               "champion": 0.6573, "reason": "challenger rmse 0.6571 vs champion 0.6573 (needs 0 better)"}
    rollout = {"mode": "shadow", "share": 1.0, "verdict": "answered as well and no slower", "agreement": 0.57,
               "compared_rows": 105, "live": {"metric": "rmse", "rows": 40, "challenger": 0.61, "champion": 0.64},
               "challenger": {"requests": 50, "failures": 1, "answer_ms": {"p50": 4.1}},
               "champion": {"requests": 105, "failures": 0, "answer_ms": {"p50": 3.9}}}
    body = evidence_body(summary, rollout, ["drift in alcohol (PSI 0.41)"])
    paragraphs = body.split("\n\n")
    # each statement a paragraph of its own, ending its sentence: the verdict and the agreement never run together
    verdict = next(p for p in paragraphs if p.startswith("Shadow trial"))
    assert verdict == "Shadow trial on 100% of the requests: answered as well and no slower."
    agreement = next(p for p in paragraphs if p.startswith("Agreement"))
    assert "57.0% of the 105 rows" in agreement and "Near 100 %" in agreement
    # failures as a share of each side's own requests, the counts in words; which way is good
    assert "| failed requests | 2.0% (1 of 50 it answered) | 0.0% (0 of 105 it answered) | 0 % |" in body
    assert "| test rmse | 0.6571 | 0.6573 | lower is better |" in body
    assert "| live rmse on 40 labelled rows | 0.61 | 0.64 | lower is better |" in body
    assert paragraphs[-1] == "Drift that started this run: drift in alcohol (PSI 0.41)"
    assert "| test accuracy | 0.9 | 0.8 | higher is better |" in evidence_body(
        {**summary, "metric": "accuracy", "challenger": 0.9, "champion": 0.8}, None, [])


@requires_ml_extra  # Ray Serve, on this side of the Ray boundary
def test_a_trial_starts_and_ends_without_changing_the_applications_code_version():
    """Serve rebuilds an application, restarting every replica, when its code version changes; a
    trial must only reconfigure the champion's replicas and start or stop the challenger's."""
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    from airflow_ray_ml.ray_serve import RayServeDeployOperator
    from airflow_ray_ml.serve_apps import CHALLENGER_DEPLOYMENT, DEPLOYMENT_NAME
    from airflow_ray_ml.serve_rollout import IDLE_AUTOSCALING, without_rollout
    from airflow_ray_ml_stages import serve

    champion = {"model_dir": "/models/a", "model_version": "a"}
    challenger = {"model_dir": "/models/b", "model_version": "b"}
    operator = RayServeDeployOperator(task_id="deploy", model=champion, app_name="trial", route_prefix="/trial")
    alone = operator.app_config(champion, {}, "dag")
    trial = operator.app_config(champion, {}, "dag", challenger=challenger,
                                rollout=Rollout(mode="shadow").user_config("b"))
    ended = without_rollout(trial)
    assert [d["name"] for d in alone["deployments"]] == [DEPLOYMENT_NAME, CHALLENGER_DEPLOYMENT]
    assert "rollout" in trial["deployments"][0]["user_config"] and trial["deployments"][1]["user_config"]
    assert ended == alone  # ending a trial puts back what the champion alone is served with
    versions = {get_app_code_version(ServeApplicationSchema(**config)) for config in (alone, trial, ended)}
    assert len(versions) == 1
    # without the idle entry, the trial's config is another code version: what the entry is for
    bare = {**alone, "deployments": alone["deployments"][:1]}
    assert get_app_code_version(ServeApplicationSchema(**bare)) not in versions
    # both sides of the Ray boundary name the deployments and the idle challenger alike
    assert (serve.DEPLOYMENT_NAME, serve.CHALLENGER_DEPLOYMENT, serve.IDLE_AUTOSCALING) == \
        (DEPLOYMENT_NAME, CHALLENGER_DEPLOYMENT, IDLE_AUTOSCALING)


# -- on the cluster, under load ----------------------------------------------------------------


def _when() -> datetime:
    return datetime(2026, 7, 1, tzinfo=timezone.utc) + timedelta(hours=next(_RUNS))


def _endpoint(prefix: str) -> str:
    return f"{RayHook().serve_url}{prefix}"


def _served_version(prefix: str) -> str | None:
    """The model version the application at ``prefix`` serves; None while nothing is served there: no
    such application, or no Serve proxy at all yet (a cluster's first deploy starts it), which refuses
    the connection. A test that ran first on a fresh cluster once failed on that refusal."""
    try:
        reply = requests.get(f"{_endpoint(prefix)}/health", timeout=10)
    except requests.ConnectionError:
        return None
    return reply.json()["model_version"] if reply.status_code == 200 else None


def _history(app: str) -> list[dict]:
    return artifacts.read_json(artifacts.join(RayHook().artifact_root, "serving", app, "history.json"))


@dataclass
class Load:
    """16 clients sending rows of the test split, and what they got: ``(time, status, version)``, the
    time (``time.time()``, as the rollout's record keeps its start and end) when the answer came."""

    prefix: str
    rows: list[dict]
    answers: list[tuple[float, int, str | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rollout_seen: list[float] = field(default_factory=list)  # times /rollout was asked and answered 200
    page_app: str | None = None  # the application whose live trial the Ray ML page is read for, while it runs
    page_trials: list[str] = field(default_factory=list)  # what the page said of it
    stop: threading.Event = field(default_factory=threading.Event)

    def client(self, index: int) -> None:
        session = requests.Session()
        position, deadline = index, time.monotonic() + 400
        while not self.stop.is_set() and time.monotonic() < deadline:
            row = self.rows[position % len(self.rows)]
            position += CLIENTS
            try:
                reply = session.post(f"{_endpoint(self.prefix)}/predict", json={"instances": [row]}, timeout=30)
                version = reply.json().get("model_version") if reply.status_code == 200 else None
                self.answers.append((time.time(), reply.status_code, version))
                if reply.status_code != 200:
                    self.errors.append(f"{reply.status_code}: {reply.text[:160]}")
            except requests.RequestException as err:
                self.errors.append(type(err).__name__)
            self.stop.wait(CLIENT_PAUSE_S)

    def watch(self) -> None:
        while not self.stop.is_set():
            try:
                asked = time.time()  # answered after this
                if requests.get(f"{_endpoint(self.prefix)}/rollout", timeout=10).status_code == 200:
                    self.rollout_seen.append(asked)
                    self.read_page()
            except requests.RequestException:
                pass
            time.sleep(0.2)

    def read_page(self) -> None:
        """What the Ray ML page shows of ``page_app``'s live trial (read as the page reads it)."""
        if self.page_app is None:
            return
        from airflow_ray_ml.plugins import ray_ml

        data = ray_ml.PageData(conn_id=ray_ml.ray_conn_id())
        ray_ml.load_serve(data)
        self.page_trials += [app.trial for app in data.apps if app.name == self.page_app and app.trial]

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(CLIENTS)]
        self.threads.append(threading.Thread(target=self.watch))
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def versions_between(self, start: float, end: float) -> set[str | None]:
        return {version for at, _, version in self.answers if start <= at <= end}


def _test_rows(data: dict) -> tuple[list[dict], list[float], str]:
    from airflow_ray_ml_stages.preprocessor import Preprocessor, raw_split_rows

    preprocessor = Preprocessor.load(data["preprocessor_uri"])
    rows, labels = raw_split_rows(data["split_uris"]["test"], preprocessor)
    return rows, [float(label) for label in labels], preprocessor.label_column


def _deploy(dag_id: str, **conf):
    when = _when()
    dag_run = load_dag(dag_id).test(logical_date=when, run_after=when, run_conf=conf)
    return dag_run, dag_run.get_task_instance("deploy").state


def _failing(model: dict, version: str) -> dict:
    """A copy of ``model`` that loads but fails every prediction (its card names a feature no row has),
    with a test metric that passes any gate: without its answers to the test rows, the gate compares
    that metric plainly."""
    failing_dir = f"{model['model_dir']}-{version}"
    shutil.copytree(model["model_dir"], failing_dir, dirs_exist_ok=True)
    card_path = os.path.join(failing_dir, "model_card.json")
    with open(card_path) as handle:
        card = json.load(handle)
    card.update(model_version=version, feature_columns=[*card["feature_columns"], "no such feature"])
    with open(card_path, "w") as handle:
        json.dump(card, handle)
    os.remove(os.path.join(failing_dir, TEST_PREDICTIONS_NAME))
    return {**model, "model_dir": failing_dir, "model_version": version, "metrics": {"test": {"rmse": 0.01}}}


@pytest.mark.integration
def test_shadow_under_load_serves_only_the_champion_compares_and_promotes(trained_models):
    models, data = trained_models.models, trained_models.data
    good, better = models["good"], models["better"]
    rows, labels, label_column = _test_rows(data)
    # the labels of the rows clients send, known after the requests (in the artifact root's data folder)
    label_file = artifacts.join(RayHook().artifact_root, "data", "rollout-labels.csv")
    import pandas as pd

    os.makedirs(os.path.dirname(label_file), exist_ok=True)
    pd.DataFrame([{**row, label_column: label} for row, label in zip(rows, labels)]).to_csv(label_file, index=False)

    _, state = _deploy("serve_rollout", model=good, data=data)
    assert state in ("success", "skipped")  # skipped: the canary test served it first
    assert _served_version("/rollout") == good["model_version"]
    with Load("/rollout", rows, page_app="wine-rollout") as load:
        before = _champion_replicas("wine-rollout")
        dag_run, state = _deploy("serve_rollout", model=better, data=data, rollout="shadow", labels=label_file)
        time.sleep(1)
        # the trial and the promotion reconfigured the champion's replicas in place: none restarted
        assert before <= _champion_replicas("wine-rollout")
    assert state == "success", json.dumps(_history("wine-rollout")[-1])
    assert load.errors == []
    assert len(load.answers) > 300
    entry = _history("wine-rollout")[-1]
    # while the challenger was in shadow (until its verdict: the promotion's config is put after it),
    # every client got the champion's answer. Not until the last /rollout answer: the ingress may
    # run two replicas, reconfigured one after the other, so one may answer /rollout for the ended
    # shadow while the other already serves the promoted model (seen once in ten runs)
    assert load.rollout_seen, "the shadow never answered /rollout"
    assert entry["rollout"]["started_at"] < entry["rollout"]["ended_at"]
    ended = datetime.fromisoformat(entry["rollout"]["ended_at"]).timestamp()
    assert load.rollout_seen[0] < ended
    assert load.versions_between(load.rollout_seen[0], ended) == {good["model_version"]}
    assert load.answers[-1][2] == better["model_version"]

    assert entry["action"] == "promoted" and entry["challenger_version"] == better["model_version"]
    # while it ran, the Ray ML page showed the trial with what it had seen so far
    trial = f"shadow of {better['model_version']} beside {good['model_version']} since {entry['rollout']['started_at']}"
    assert any(text.startswith(trial) and " of 300 rows for the verdict; shadow 100%, " in text and " rows compared, " in text
               for text in load.page_trials), load.page_trials[-3:]
    shadow = entry["rollout"]
    assert shadow["mode"] == "shadow" and shadow["share"] == 1.0
    assert shadow["compared_rows"] >= 300 and shadow["challenger"]["failures"] == 0
    assert 0 <= shadow["agreement"] <= 1 and shadow["mean_abs_difference"] > 0
    assert shadow["champion"]["answer_ms"]["p50"] > 0 and shadow["challenger"]["answer_ms"]["p50"] > 0
    # the label file scored both on the rows it labels, and the better model is better there too
    assert shadow["live"]["rows"] >= 20
    assert shadow["live"]["challenger"] < shadow["live"]["champion"]
    assert "labelled live rows" in entry["reason"]
    assert xcom(dag_run, "deploy")["action"] == "promoted"
    # the challenger is gone: the champion serves alone, and the challenger's replica stops
    assert requests.get(f"{_endpoint('/rollout')}/rollout", timeout=10).status_code == 404
    _wait_for_no_challenger_replica("wine-rollout")


def _champion_replicas(app: str) -> set[str]:
    deployments = RayHook().get_serve_applications()["applications"][app]["deployments"]
    return {replica["replica_id"] for replica in deployments["ModelServer"]["replicas"] if replica["state"] == "RUNNING"}


def _wait_for_no_challenger_replica(app: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        deployments = RayHook().get_serve_applications()["applications"][app]["deployments"]
        replicas = (deployments.get("Challenger") or {}).get("replicas") or []
        if not replicas:
            return
        assert time.monotonic() < deadline, f"the challenger still runs {len(replicas)} replica(s): {replicas}"
        time.sleep(1)


@pytest.mark.integration
def test_a_canary_that_fails_every_request_is_rolled_back_by_itself_and_clients_see_no_error(trained_models):
    models, data = trained_models.models, trained_models.data
    rows, _, _ = _test_rows(data)
    if _served_version("/rollout") is None:
        assert _deploy("serve_rollout", model=models["good"], data=data)[1] == "success"
    champion = _served_version("/rollout")
    failing = _failing(models["better"], "failing-canary-1")

    with Load("/rollout", rows) as load:
        dag_run, state = _deploy("serve_rollout", model=failing, data=data, rollout="canary", share=0.5)
    assert state == "failed"
    assert [ti.try_number for ti in dag_run.get_task_instances()] == [1]  # the model's fault: no retry
    assert load.errors == []
    assert load.versions_between(0, float("inf")) == {champion}
    entry = _history("wine-rollout")[-1]
    assert entry["action"] == "rolled_back" and entry["challenger_version"] == "failing-canary-1"
    canary = entry["rollout"]
    assert canary["mode"] == "canary" and canary["challenger"]["failures"] == canary["challenger"]["requests"] > 0
    assert "KeyError" in canary["last_failure"] and "failed" in entry["error"]
    # rolled back on its error rate, long before the 300 rows the rollout would otherwise answer
    assert canary["challenger"]["rows"] < 300
    assert requests.get(f"{_endpoint('/rollout')}/rollout", timeout=10).status_code == 404
    _wait_for_no_challenger_replica("wine-rollout")


@pytest.mark.integration
def test_a_canary_that_answers_well_is_promoted_by_itself_under_load_with_no_failed_request(trained_models):
    models, data = trained_models.models, trained_models.data
    good, better = models["good"], models["better"]
    rows, _, _ = _test_rows(data)
    assert _deploy("serve_canary", model=good, data=data)[1] == "success"

    with Load("/canary", rows) as load:
        dag_run, state = _deploy("serve_canary", model=better, data=data, rollout="canary", share=0.5)
        time.sleep(1)
    assert state == "success", _history("wine-canary")[-1]
    assert load.errors == []
    # during the canary the challenger answered its share of the clients' requests, then it alone
    during = load.versions_between(load.rollout_seen[0], load.rollout_seen[-1])
    assert during == {good["model_version"], better["model_version"]}
    assert load.answers[-1][2] == better["model_version"]
    canary = _history("wine-canary")[-1]["rollout"]
    assert canary["mode"] == "canary" and canary["challenger"]["rows"] >= 300
    assert canary["challenger"]["failures"] == 0 and canary["compared_rows"] == 0
    assert xcom(dag_run, "deploy")["action"] == "promoted"
    _wait_for_no_challenger_replica("wine-canary")


# -- approval through Airflow's Human-in-the-loop ------------------------------------------------


@pytest.fixture(scope="module")
def approver(airflow_db, tmp_path_factory):
    """Airflow's api-server on the test database, and a token of the user ``ana`` who answers approvals."""
    from tests.plugins.api_server import running_api_server

    home = tmp_path_factory.mktemp("approval-api")
    (home / "passwords.json").write_text(json.dumps({"ana": "ana-password"}))
    with running_api_server(home, AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="ana:admin",
                            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(home / "passwords.json")) as base:
        token = requests.post(f"{base}/auth/token", json={"username": "ana", "password": "ana-password"},
                              timeout=30).json()["access_token"]
        yield base, {"Authorization": f"Bearer {token}"}


@dataclass
class Answerer:
    """Answers the next approval request of ``dag_id`` through the HITL REST API, as a person in the UI would."""

    base: str
    headers: dict
    dag_id: str
    chosen: str
    reason: str = ""
    asked: dict = field(default_factory=dict)  # the request answered
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)  # the deploy ended (or was interrupted)

    def run(self) -> None:
        deadline = time.monotonic() + 240
        listing = f"{self.base}/api/v2/dags/{self.dag_id}/dagRuns/~/hitlDetails"
        seen_before: list[dict] = []
        try:
            while time.monotonic() < deadline and not self.stop.is_set():
                details = requests.get(listing, headers=self.headers, timeout=30).json().get("hitl_details", [])
                # as the Required Actions page offers it: once the task waits (an answer recorded
                # while the task is still parking would resume nothing)
                waiting = [detail for detail in details if not detail.get("response_received")
                           and detail["task_instance"]["state"] in ("awaiting_input", "deferred")]
                # seen waiting on two polls a second apart: the task has finished parking (an
                # answer recorded just as it parked once resumed nothing in CI, dag.test() waiting for ever)
                seen, waiting = waiting, [detail for detail in waiting if detail in seen_before]
                seen_before = seen
                if waiting:
                    self.asked = waiting[0]
                    ti = self.asked["task_instance"]
                    answer = requests.patch(
                        f"{self.base}/api/v2/dags/{self.dag_id}/dagRuns/{ti['dag_run_id']}/taskInstances/"
                        f"{ti['task_id']}/{ti['map_index']}/hitlDetails", headers=self.headers, timeout=30,
                        json={"chosen_options": [self.chosen], "params_input": {"reason": self.reason}})
                    assert answer.status_code == 200, answer.text
                    return
                self.stop.wait(1)
            self.error = "no approval was asked for"
        except Exception as err:  # reported by the test, which runs dag.test() in the main thread
            self.error = repr(err)


def _deploy_answered(approver, chosen: str, reason: str = "", **conf):
    base, headers = approver
    answerer = Answerer(base, headers, "serve_approval", chosen, reason)
    thread = threading.Thread(target=answerer.run)
    thread.start()
    try:
        dag_run, state = _deploy("serve_approval", **conf)
    finally:
        answerer.stop.set()  # an interrupted run does not wait out the answerer's 4 minutes
        thread.join()
    assert answerer.error is None, answerer.error
    return dag_run, state, answerer.asked


@pytest.mark.integration
def test_approval_approve_promotes_and_reject_keeps_the_champion_with_the_reason(trained_models, approver, tmp_path):
    models, data = trained_models.models, trained_models.data
    good, better = models["good"], models["better"]

    _, state, asked = _deploy_answered(approver, "Approve", model=good, data=data)
    assert state == "success"
    assert asked["subject"] == f"Promote {good['model_version']} to wine-approval?"
    assert "nothing is served yet" in asked["body"]
    entry = _history("wine-approval")[-1]
    assert entry["action"] == "promoted" and entry["approval"]["approved"] is True
    assert entry["approval"]["by"] == "ana"

    # the better model passes the gate; a person rejects it, saying why
    dag_run, state, asked = _deploy_answered(approver, "Reject", reason="retrain after the price change",
                                             model=better, data=data)
    assert state == "skipped"
    assert f"test rmse | {better['metrics']['test']['rmse']:.4g} | {good['metrics']['test']['rmse']:.4g}" in asked["body"]
    entry = _history("wine-approval")[-1]
    assert entry["action"] == "kept_champion" and entry["champion_version"] == good["model_version"]
    assert entry["reason"] == "rejected by ana: retrain after the price change"
    assert xcom(dag_run, "deploy", key="decision")["reason"] == entry["reason"]
    assert _served_version("/approval") == good["model_version"]

    _, state, _ = _deploy_answered(approver, "Approve", reason="checked on the orders of last week", model=better, data=data)
    assert state == "success"
    assert _served_version("/approval") == better["model_version"]
    assert _history("wine-approval")[-1]["approval"]["by"] == "ana"

    # what the approver typed is on the Ray ML page, in a browser signed in as ana
    from tests.plugins.test_ray_ml_page import CHROMIUM, dom_signed_in

    if CHROMIUM is None:
        pytest.skip("no chromium binary for the page's browser check (CI's .ci/run installs one)")
    from airflow_ray_ml.plugins import ray_ml

    base, headers = approver
    html = dom_signed_in(f"{base}{ray_ml.URL_PREFIX}/", headers["Authorization"].removeprefix("Bearer "),
                         str(tmp_path / "profile"))
    section = html[html.index('data-history-app="wine-approval"'):]
    section = section[:section.index("</section>")]
    assert '<td class="approval">approved by ana: checked on the orders of last week</td>' in section, section[:3000]
