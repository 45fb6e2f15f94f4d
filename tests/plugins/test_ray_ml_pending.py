"""The Ray ML page shows a running stage job whose trials wait for the cluster's resources as pending, with why."""

from __future__ import annotations

import http.server
import json
import threading

from airflow_ray_ml.plugins import ray_ml
from airflow_ray_ml.plugins.ray_ml_runs import StageJob
from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import WAITING_NAME

REASON = ("1.8 CPU held by Serve apps app-a, app-b, app-c (1.8); 0.2 of 2 CPU free; each trial needs 1 CPU")


def _jobs_api(statuses: dict[str, str]):
    """A loopback server that answers the Jobs API's GET /api/jobs/<id> with each job's status."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            submission_id = self.path.rstrip("/").rsplit("/", 1)[-1]
            if submission_id not in statuses:
                self.send_error(404)
                return
            body = json.dumps({"submission_id": submission_id, "status": statuses[submission_id],
                               "message": "Job is currently running."}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_page_shows_a_running_job_whose_trials_wait_as_pending_with_the_reason(monkeypatch, tmp_path):
    server = _jobs_api({"tune-job": "RUNNING", "done-job": "RUNNING", "train-job": "SUCCEEDED"})
    try:
        root = str(tmp_path)
        monkeypatch.setenv("AIRFLOW_CONN_RAY_PENDING", json.dumps({"conn_type": "ray_ml", "extra": {
            "dashboard_url": f"http://127.0.0.1:{server.server_address[1]}", "artifact_root": root}}))
        jobs = [StageJob("wine", "run1", "tune", -1, "tune-job"), StageJob("wine", "run1", "search", -1, "done-job"),
                StageJob("wine", "run1", "train", -1, "train-job")]
        waiting = {"tune": {"state": "pending", "what": "trials", "reason": REASON},
                   "search": {"state": "running", "what": "trials", "reason": ""},
                   "train": {"state": "pending", "what": "workers", "reason": "an old file of an ended job"}}
        for task_id, content in waiting.items():
            artifacts.write_json_atomic(
                artifacts.join(artifacts.run_dir(root, "wine", "run1", task_id, -1), WAITING_NAME), content)
        data = ray_ml.PageData(conn_id="ray_pending", jobs=jobs)
        ray_ml.load_job_statuses(data)
    finally:
        server.shutdown()
    assert data.jobs_error is None
    tune, search, train = data.jobs
    assert tune.status == "PENDING" and tune.message == f"trials pending: {REASON}"
    assert (search.status, search.message) == ("RUNNING", "Job is currently running.")  # its trials have started
    assert train.status == "SUCCEEDED"  # an ended job is what Ray says, whatever a file left behind says
    data.tune = ray_ml.TuneRun(dag_id="wine", run_id="run1", task_id="tune", map_index=-1, pushed_at="now",
                               result={"best_trial_id": "t1", "plot_uri": "/p.png"}, rows=[])
    html = ray_ml.render(data)
    assert 'class="status-PENDING">PENDING<' in html and "held by Serve apps app-a, app-b, app-c" in html
