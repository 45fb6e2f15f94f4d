"""Ray-side stages of airflow-ray-ml.

This package runs on the Ray cluster (as Ray jobs and Serve applications). It never imports
``airflow``: the Airflow side talks to it only through job entry points
(``python -m airflow_ray_ml_stages.<stage> --spec '<json>'``) and the JSON-able dataclasses in :mod:`airflow_ray_ml_stages.specs`.
"""

__version__ = "0.1.0"
