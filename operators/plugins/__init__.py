"""Airflow UI plugins of the provider: the "Ray ML" page (``ray_ml``)."""
