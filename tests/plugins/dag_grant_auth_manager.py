"""An auth manager that grants each user read access to a listed set of DAGs, for the page's tests.

Airflow's default SimpleAuthManager decides DAG access by role alone (a viewer reads every DAG) or,
in multi-team mode, by team; it has no per-DAG grants. This subclass keeps its users, passwords,
login and tokens and adds one thing: a non-admin user reads only the DAGs listed for them in
``[dag_grants] grants`` (``AIRFLOW__DAG_GRANTS__GRANTS``), a JSON object
``{"username": ["dag_id", ...]}``. Set ``[core] auth_manager`` to
``tests.plugins.dag_grant_auth_manager.DagGrantAuthManager`` to use it.
"""

from __future__ import annotations

import json

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.configuration import conf

GRANTS_SECTION = "dag_grants"


def granted_dag_ids(username: str) -> set[str]:
    """The DAG ids ``[dag_grants] grants`` lists for ``username`` (none when unlisted)."""
    raw = conf.get(GRANTS_SECTION, "grants", fallback="{}") or "{}"
    try:
        grants = json.loads(raw)
    except ValueError:
        raise ValueError(f"[{GRANTS_SECTION}] grants must be a JSON object of lists, got {raw!r}") from None
    return set(grants.get(username) or ())


class DagGrantAuthManager(SimpleAuthManager):
    """SimpleAuthManager whose non-admin users read only the DAGs granted to them."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        allowed_by_role = super().is_authorized_dag(method=method, user=user, access_entity=access_entity,
                                                    details=details)
        is_admin = (user.role or "").upper() == "ADMIN"  # SimpleAuthManager's own test (3.1 has no _is_admin)
        if not allowed_by_role or is_admin or details is None or details.id is None:
            return allowed_by_role
        return details.id in granted_dag_ids(user.username)
