"""``python -m airflow_ray_ml_stages.data``: run the stage from its importable module (see :func:`airflow_ray_ml_stages.stage.main_of`)."""

import sys

from airflow_ray_ml_stages.stage import main_of

if __name__ == "__main__":
    sys.exit(main_of("airflow_ray_ml_stages.data.stage"))
