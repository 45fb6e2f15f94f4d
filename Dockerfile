# Airflow with the airflow-ray-ml provider, on the official image (Airflow 3.3.2, Python 3.11).
# The Airflow side needs no torch or GPU: stages run on the Ray cluster as Ray jobs.
# Build: docker build -t airflow-ray-ml .
FROM apache/airflow:3.3.2-python3.11

# The image's convention: install Python packages as the `airflow` user, and pin apache-airflow to
# the image's own version in the same command so pip never up- or downgrades it.
USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/airflow/project/
COPY --chown=airflow:root operators /opt/airflow/project/operators
COPY --chown=airflow:root include /opt/airflow/project/include
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /opt/airflow/project

COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins

# The Ray cluster is reached through the `ray_default` connection, for example:
#   AIRFLOW_CONN_RAY_DEFAULT='{"conn_type": "ray", "extra": {"dashboard_url": "http://ray-head:8265",
#                             "auth_token": "...", "artifact_root": "s3://bucket/airflow-ray-ml"}}'
