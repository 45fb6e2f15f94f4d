"""serve_rollback_dag(): the rollback DAG a team enables with one call in a file of its DAGs folder."""

from __future__ import annotations

from tests.conftest import load_dag


def test_serve_rollback_dag_called_in_a_dag_file_registers_under_that_file_with_the_id_given(tmp_path):
    (tmp_path / "team_rollback.py").write_text(
        "from airflow_ray_ml.serve_rollback_dag import serve_rollback_dag\n\nserve_rollback_dag('team_rollback')\n")
    dag = load_dag("team_rollback", tmp_path)
    assert dag.fileloc == str(tmp_path / "team_rollback.py")  # the team's file, not the package's
    assert dag.task_ids == ["serve_again"] and set(dag.params) == {"app_name", "version", "reason"}

