"""A Serve application as this project deploys it: its name and route, the DAG that owns it, and
the model version it serves, read from the declarative config Serve keeps for it.

The deploy names an application after its DAG unless told otherwise, records that DAG in the
deployment's ``user_config`` (``OWNER_KEY``), and refuses to replace an application another DAG
owns (:func:`check_ownership`). The "Ray ML" page, the rollback and batch scoring read the same keys.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_ray_ml.errors import InvalidSpecError, ServeAppOwnershipError

APP_IMPORT_PATH = "airflow_ray_ml_stages.serve:build_app"  # kept equal to airflow_ray_ml_stages.serve.APP_IMPORT_PATH by a test
DEPLOYMENT_NAME = "ModelServer"
CHALLENGER_DEPLOYMENT = "Challenger"  # kept equal to airflow_ray_ml_stages.serve.CHALLENGER_DEPLOYMENT by a test
APP_NAME_MAX_LENGTH = 63
APP_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{APP_NAME_MAX_LENGTH - 1}}}")
ROUTE_PREFIX = re.compile(r"/(?:[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*)?")
# The key of the deployment's user_config that names the DAG owning the application. Serve keeps
# user_config as given and returns it in deployed_app_config; the replicas ignore the key.
OWNER_KEY = "owner_dag_id"


def app_name_for_dag(dag_id: str) -> str:
    """The Serve application of a deploy that names none: its DAG's id, made a valid ``APP_NAME``.

    Each run of characters a name may not hold becomes one ``-``, leading ``.``, ``_`` and ``-``
    are dropped (a name starts with a letter or digit), and the rest is cut to
    ``APP_NAME_MAX_LENGTH`` characters: DAG ``"_ventes.prévisions"`` gets ``"ventes.pr-visions"``.
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", dag_id).lstrip("._-")[:APP_NAME_MAX_LENGTH]
    if not APP_NAME.fullmatch(name):
        raise InvalidSpecError(f"no Serve application name can be made from DAG id {dag_id!r} (it needs a letter "
                               "or digit); pass app_name= to RayServeDeployOperator")
    return name


def _user_config_value(app_config: dict[str, Any] | None, key: str) -> str | None:
    """``key`` of the first deployment's ``user_config`` that has it, in an application's config."""
    for deployment in (app_config or {}).get("deployments") or []:
        value = (deployment.get("user_config") or {}).get(key)
        if value:
            return str(value)
    return None


def app_owner(app_config: dict[str, Any] | None) -> str | None:
    """The DAG recorded as the application's owner, if any."""
    return _user_config_value(app_config, OWNER_KEY)


def app_model_dir(app_config: dict[str, Any] | None) -> str | None:
    """The model directory an application's config serves, if any."""
    return _user_config_value(app_config, "model_dir")


def app_model_version(app_config: dict[str, Any] | None) -> str | None:
    """The model version an application's config serves, if any."""
    return _user_config_value(app_config, "model_version")


def check_ownership(app_name: str, live_app: dict[str, Any] | None, dag_id: str, allow_takeover: bool) -> str | None:
    """Refuse to deploy over an application that another DAG owns, unless ``allow_takeover``.

    :param live_app: the application's entry in Serve's state (None when it is not live).
    :return: who is taken over from, in words, when an application owned by another DAG (or not
        deployed by this operator) is deployed over; None when the application is this DAG's, new,
        or was deployed by this operator before owners were recorded.
    """
    if live_app is None:
        return None
    config = live_app.get("deployed_app_config") or {}
    owner = app_owner(config)
    if owner == dag_id or (owner is None and config.get("import_path") == APP_IMPORT_PATH):
        return None
    if owner is not None:
        taken_from = f"DAG {owner!r}"
        problem = f"belongs to DAG {owner!r}"
        after = f" (DAG {owner!r} is then refused in turn)"
    else:
        import_path = config.get("import_path") or "none: deployed from code, not a config"
        taken_from = f"an application not deployed by RayServeDeployOperator (import_path {import_path!r})"
        problem = f"was not deployed by RayServeDeployOperator (import_path {import_path!r})"
        after = ""
    if allow_takeover:
        return taken_from
    raise ServeAppOwnershipError(
        f"Serve application {app_name!r} {problem}; DAG {dag_id!r} will not replace what it serves. Give "
        f"this DAG its own app_name and route_prefix, or pass allow_takeover=True to RayServeDeployOperator "
        f"to take the application over{after}."
    )
