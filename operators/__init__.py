"""Airflow side of airflow-ray-ml: a provider-style package of hooks, triggers, links and operators.

``get_provider_info`` is what Airflow's ``apache_airflow_provider`` entry point reads: it declares
the ``ray_ml`` connection type (with its connection-form fields), the ``@task.ray`` decorator, the extra
links and the "Ray ML" page's config section (the page's plugin is registered by the
``airflow.plugins`` entry point alone).
"""

from __future__ import annotations

__version__ = "0.1.0"
# Not "ray": the deprecated astronomer Ray provider registers that type, and Airflow keeps one hook
# per type (docs/deployment.md#the-connection-type-ray_ml).
CONN_TYPE = "ray_ml"
CONN_TYPE_NAME = "Ray ML"  # what the connection form's type list shows


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-ray-ml",
        "name": "Ray ML",
        "description": "Run Ray Data, Train, Tune and Serve stages from Airflow 3 as Ray jobs.",
        "versions": [__version__],
        "integrations": [
            {"integration-name": "Ray", "external-doc-url": "https://docs.ray.io/", "tags": ["software"]}
        ],
        "hooks": [{"integration-name": "Ray", "python-modules": ["airflow_ray_ml.hooks.ray"]}],
        "triggers": [{"integration-name": "Ray", "python-modules": ["airflow_ray_ml.triggers.ray"]}],
        # `from airflow.sdk import task; @task.ray(...)`: a function run as a Ray job (docs/operators/ray-job.md)
        "task-decorators": [{"class-name": "airflow_ray_ml.decorators.ray.ray_task", "name": "ray"}],
        "extra-links": [
            "airflow_ray_ml.links.ray.RayJobLink",
            "airflow_ray_ml.links.ray.RayJobLogLink",
            "airflow_ray_ml.links.ray.RayServeEndpointLink",
            "airflow_ray_ml.links.ray.RayServeDashboardLink",
        ],
        # No "plugins" here: the package's "airflow.plugins" entry point (pyproject.toml) registers the
        # page, and with [core] lazy_discover_providers = False Airflow would load a plugin declared
        # here as well, a second registration that it reports as a plugin import error.
        "config": {
            "ray_ml": {
                "description": "The \"Ray ML\" page of the Airflow UI (operators/plugins/ray_ml.py).",
                "options": {
                    "ray_conn_id": {
                        "description": "The connection the page reads Ray through; empty: the hook's "
                        "default connection (ray_default).",
                        "version_added": None, "type": "string", "example": "ray_prod", "default": None,
                    },
                    "dashboard_url": {
                        "description": "The Ray dashboard as a person's browser reaches it, when not "
                        "where Airflow does (e.g. inside docker compose); empty: the connection's.",
                        "version_added": None, "type": "string", "example": "http://127.0.0.1:8265",
                        "default": None,
                    },
                    "serve_url": {
                        "description": "Ray Serve's HTTP address as a person's browser reaches it; "
                        "empty: the connection's.",
                        "version_added": None, "type": "string", "example": "http://127.0.0.1:8000",
                        "default": None,
                    },
                    "serve_action_dag_id": {
                        "description": "The DAG that the page's Roll back and Pin buttons trigger "
                        "(airflow_ray_ml.serve_rollback_dag defines it); empty: ray_serve_rollback.",
                        "version_added": None, "type": "string", "example": "ray_serve_rollback",
                        "default": None,
                    },
                },
            }
        },
        "connection-types": [
            {
                "hook-class-name": "airflow_ray_ml.hooks.ray.RayHook",
                "hook-name": CONN_TYPE_NAME,
                "connection-type": CONN_TYPE,
                "conn-fields": {
                    "dashboard_url": {
                        "label": "Dashboard URL",
                        "description": "Address of the Ray dashboard (Jobs and Serve REST API), "
                        "for example http://127.0.0.1:8265",
                        "schema": {"type": ["string", "null"]},
                    },
                    "auth_token": {
                        "label": "Auth token",
                        "description": "Ray token-auth token; empty means RAY_AUTH_TOKEN or "
                        "~/.ray/auth_token",
                        "schema": {"type": ["string", "null"], "format": "password"},
                    },
                    "verify_tls": {
                        "label": "Verify TLS certificates",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "serve_url": {
                        "label": "Serve HTTP URL",
                        "description": "Where Ray Serve's HTTP proxy answers; empty means the "
                        "dashboard's host on port 8000",
                        "schema": {"type": ["string", "null"]},
                    },
                    "artifact_root": {
                        "label": "Artifact root",
                        "description": "Where stages write their outputs: a path the cluster can "
                        "reach, s3://bucket/prefix or gs://bucket/prefix",
                        "schema": {"type": ["string", "null"]},
                    },
                    "storage_conn_id": {
                        "label": "Storage connection",
                        "description": "An aws connection (access key, secret, extra endpoint_url "
                        "and region_name) that Airflow reads and writes an s3:// artifact root with; "
                        "empty means the environment's credentials. Ray nodes use their own",
                        "schema": {"type": ["string", "null"]},
                    },
                    "allowed_sources": {
                        "label": "Allowed sources",
                        "description": "Where data files named by a run's conf or trigger form may lie, "
                        "besides the artifact root's data folder: path or URL prefixes (s3://bucket/prefix, "
                        "https://host/path), one per line or comma-separated",
                        "schema": {"type": ["string", "null"]},
                    },
                    "retries": {
                        "label": "Retries",
                        "description": "How many times a call that failed transiently (no connection, a "
                        "timeout, HTTP 502/503/504) is sent again; only calls that are safe to repeat. "
                        "0 turns retries off",
                        "schema": {"type": ["integer", "null"], "minimum": 0, "default": 5},
                    },
                    "retry_max_wait_s": {
                        "label": "Longest wait between retries (s)",
                        "description": "Waits double from 1 s (1, 2, 4, 8, 16...) up to this many seconds; "
                        "the defaults give up after about 35 s of waiting",
                        "schema": {"type": ["number", "null"], "minimum": 0, "default": 16},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port", "extra"],
                    "relabeling": {"host": "Dashboard URL (alternative)", "password": "Auth token (alternative)"},
                    "placeholders": {"host": "http://127.0.0.1:8265"},
                },
            }
        ],
    }
