"""Retraining that drift starts: the DAG run that promoted the served model, run again with its Params.

A model trained on a team's own table, label and settings must be retrained on that table, with
those settings (its rollout and approval included), not on a DAG's defaults. The deploy keeps the
run that promoted each version with it (``serve_history.run_record_uri``: its DAG, run id and
resolved Params); when batch scoring finds that a file drifted from that model's training data,
:func:`retraining_run` names that DAG and those Params, and :class:`DriftRetrainOperator` triggers
the run, its note saying why. A model whose run was not kept (promoted by hand, or before runs
were kept) starts nothing: the task is skipped, saying so.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

from airflow_ray_ml.plugins.decision_notes import MAX_NOTE_CHARS, STARTED_BY
from airflow_ray_ml.serve_history import read_run_record, serving_dir

# A run that drift started is named after the scoring run that found the drift (one per scoring run).
RUN_ID_PREFIX = "drift__"


def retraining_run(manifest: dict[str, Any], model: dict[str, Any], artifact_root: str | None,
                   scoring_run_id: str, dag_id: str, new_data: list[str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """What to run for a scoring ``manifest`` (the score task's XCom) of the served ``model`` (its
    ``app`` and ``model_version``): ``({"conf", "run_id", "note"}, why)`` for a run of ``dag_id``,
    or ``(None, why not)`` when the file did not drift, the model's run was not kept, or another
    DAG trained it.

    ``new_data``: files of labelled rows (already confined to the allowed sources) that the run reads
    after the model's own ``source``; a model trained on generated demo data (no ``source``) is not
    retrained with them, since the run would read them alone.
    """
    drift = manifest.get("drift") or {}
    version = manifest.get("model_version") or model.get("model_version")
    if drift.get("verdict") != "drift":
        return None, f"no retraining: the scored file has not drifted (verdict {drift.get('verdict')!r})"
    app = model.get("app")
    record = read_run_record(serving_dir(artifact_root, app), version) if app else None
    if not record:
        return None, (f"no retraining: the run that promoted model {version} was not kept with it (promoted by "
                      f"hand, or before runs were kept); trigger the DAG that trains {app or 'it'} with its "
                      "source and settings to retrain it")
    if record["dag_id"] != dag_id:
        return None, (f"no retraining: model {version} was trained by DAG {record['dag_id']!r}, and this task "
                      f"retrains {dag_id!r}; retrain it from a DriftRetrainOperator whose trigger_dag_id is "
                      f"{record['dag_id']!r}")
    conf = dict(record.get("params") or {})
    added = ""
    if new_data:
        if not conf.get("source"):
            return None, (f"no retraining: model {version} was trained on generated demo data (its run had no "
                          f"`source`), so the new data {new_data} would be read alone; retrain it on a table of "
                          "yours first")
        conf["source"] = [*conf["source"], *(path for path in new_data if path not in conf["source"])]
        added = f", plus the new rows of {', '.join(new_data)}"
    note = (f"{STARTED_BY}{drift.get('reason')} in {manifest.get('input_uri')} (model {version}; scoring run "
            f"{scoring_run_id}), with the source and settings of {record['dag_id']} run {record['run_id']}, "
            f"which trained it{added}")
    return ({"conf": conf,
             "run_id": f"{RUN_ID_PREFIX}{scoring_run_id}", "note": note[:MAX_NOTE_CHARS]},
            f"retraining {record['dag_id']} with the Params of run {record['run_id']}")


# TriggerDagRunOperator takes a note from the standard provider of early 2026 on; the releases beside
# Airflow 3.1.1 do not, and would refuse the argument when the DAG is parsed.
_TAKES_NOTE = "note" in inspect.signature(TriggerDagRunOperator.__init__).parameters


class DriftRetrainOperator(TriggerDagRunOperator):
    """Trigger the retraining :func:`retraining_run` planned: Airflow's ``TriggerDagRunOperator``
    with its ``note`` templated too, so the plan's XComArgs fill it, ``conf`` and the run id. The DAG
    it triggers is named when the DAG is written (``trigger_dag_id``: Airflow draws the dependency
    between the two DAGs from it), and a model another DAG trained is not retrained by it. With a
    standard provider too old to pass a note on, the run starts without one."""

    template_fields: Sequence[str] = (*TriggerDagRunOperator.template_fields, "note")

    def __init__(self, *, note: str | None = None, **kwargs: Any) -> None:
        super().__init__(**({"note": note} if _TAKES_NOTE else {}), **kwargs)
        if not _TAKES_NOTE:
            self.note = note
