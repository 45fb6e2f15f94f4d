"""The docs' stage-settings tables say what the specs say: the spec is the one place a setting is declared."""

from __future__ import annotations

import re

import pytest

from airflow_ray_ml.contract import spec_param_docs
from airflow_ray_ml.gpu_probe import GPUProbeOperator
from airflow_ray_ml.ray_data import RayDataPreprocessOperator
from airflow_ray_ml.ray_score import RayBatchScoreOperator
from airflow_ray_ml.ray_train import RayTrainOperator
from airflow_ray_ml.ray_tune import RayTuneOperator
from tests.conftest import ROOT

PAGES = {
    "gpu-probe.md": GPUProbeOperator,
    "data-preprocess.md": RayDataPreprocessOperator,
    "tune.md": RayTuneOperator,
    "train.md": RayTrainOperator,
    "batch-score.md": RayBatchScoreOperator,
}
_ROW = re.compile(r"^\| `(\w+)` \| .* \| (.*) \|$")


def _settings_table(text: str) -> dict[str, str]:
    """The rows of the table that follows the sentence naming the spec it mirrors."""
    tail = text[re.search(r"mirrors\s+`airflow_ray_ml_stages\.specs\.", text).start():]
    rows: dict[str, str] = {}
    for line in tail.splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        match = _ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize(("page", "operator"), sorted(PAGES.items()))
def test_operator_page_settings_table_matches_its_spec(page, operator):
    rows = _settings_table((ROOT / "docs" / "operators" / page).read_text())
    docs = spec_param_docs(operator.spec_type)
    assert set(rows) == set(operator.spec_arguments), "regenerate the table from the spec (docs/development.md)"
    for name, what in rows.items():
        assert what.replace("\\|", "|") == docs[name], name
