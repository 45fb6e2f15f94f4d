# Two images from one file (docker-compose.yaml builds both):
#
#   --target ray      a Ray node (head or worker) with the project's Ray side and its ml deps
#   --target airflow  Airflow 3.3.2 with the provider installed (the default: the last stage)
#
# Build: docker build -t airflow-ray-ml .        docker build --target ray -t airflow-ray-ml-ray .

# -- Ray nodes ----------------------------------------------------------------------------------
# python:3.11-slim rather than rayproject/ray:2.60.0-py311: the Ray image ships its own numpy,
# pandas and pyarrow, which the project's pins (pyproject.toml) would replace anyway, doubling the
# layer; here pip resolves exactly the set `make install` and the tests use, with the same Python
# minor version as the Airflow image (Ray needs driver and nodes to agree on it).
FROM python:3.11-slim-bookworm AS ray

# The CPU wheel of torch by default; build with --build-arg TORCH_INDEX_URL= (empty) to take
# PyPI's CUDA build for GPU nodes (docker-compose.yaml does for the gpu profile).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0

# uid 50000 and gid 0, like the `airflow` user of Airflow's image: both write the shared artifacts.
RUN useradd --uid 50000 --gid 0 --create-home --shell /bin/bash ray
WORKDIR /opt/airflow-ray-ml
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY operators ./operators
COPY include ./include
COPY scripts/compose_init.py ./compose_init.py
# Ray nodes need the Ray side and the `ml` extra, not Airflow: install the project's own pins minus
# apache-airflow (read from pyproject.toml, so they never drift), then the package without deps.
# torch at the tested version (constraints.txt's, without its +cpu), from the index chosen above.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join([d for d in p['dependencies'] if not d.startswith('apache-airflow')] \
+ p['optional-dependencies']['ml'] \
+ [line.strip().split('+')[0] for line in open('constraints.txt') if line.startswith('torch==')]))" \
    > /tmp/ray-requirements.txt \
    && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r /tmp/ray-requirements.txt \
    && pip install --no-deps . \
    && rm /tmp/ray-requirements.txt
USER ray
WORKDIR /home/ray

# -- Airflow ------------------------------------------------------------------------------------
# Airflow with the airflow-ray-ml provider, on the official image (Airflow 3.3.2, Python 3.11).
# The Airflow side needs no torch or GPU: stages run on the Ray cluster as Ray jobs.
FROM apache/airflow:3.3.2-python3.11 AS airflow

# The image's convention: install Python packages as the `airflow` user, and pin apache-airflow to
# the image's own version in the same command so pip never up- or downgrades it.
USER airflow
COPY --chown=airflow:root pyproject.toml README.md LICENSE /opt/airflow/project/
COPY --chown=airflow:root operators /opt/airflow/project/operators
COPY --chown=airflow:root include /opt/airflow/project/include
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /opt/airflow/project

COPY --chown=airflow:root dags /opt/airflow/dags
COPY --chown=airflow:root plugins /opt/airflow/plugins

# The Ray cluster is reached through the `ray_default` connection, for example:
#   AIRFLOW_CONN_RAY_DEFAULT='{"conn_type": "ray_ml", "extra": {"dashboard_url": "http://ray-head:8265",
#                             "auth_token": "...", "artifact_root": "s3://bucket/airflow-ray-ml"}}'
# docker-compose.yaml runs this image as api-server, scheduler, dag-processor and triggerer.
