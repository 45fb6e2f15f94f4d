"""The "Ray ML" page's Roll back and Pin buttons run this DAG; it ships with airflow-ray-ml."""

from airflow_ray_ml.serve_rollback_dag import serve_rollback_dag

serve_rollback_dag()
