"""One-shot set-up of the docker compose stack's shared secrets and artifact volume.

Run by the ``ray-ml-init`` service (as root, once per volume): creates each secret only if it
is missing, so restarts keep the same token and keys, and hands the files and the artifact
directory to uid 50000 (the ``airflow`` user of Airflow's image, and the ``ray`` user of ours):

- ``ray_auth_token``: Ray's token-auth token (every Ray node reads it through
  ``RAY_AUTH_TOKEN_PATH``, and so does RayHook in Airflow);
- ``jwt_secret``, ``api_secret_key``, ``fernet_key``: Airflow's, the same in every Airflow
  container (read with ``AIRFLOW__…_CMD``);
- ``airflow_passwords.json``: the admin password of Airflow's simple auth manager.

A value given in the environment (``RAY_AUTH_TOKEN``, ``AIRFLOW_ADMIN_PASSWORD``) is used
instead of a generated one when the file does not exist yet.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
from pathlib import Path

OWNER_UID, OWNER_GID = 50000, 0


def _write_once(path: Path, value: str) -> bool:
    if path.exists() and path.read_text().strip():
        return False
    path.write_text(value + "\n")
    return True


def main(secrets_dir: str = "/run/airflow-ray-ml", artifacts_dir: str = "/shared/artifacts") -> int:
    folder = Path(secrets_dir)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {
        "ray_auth_token": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32),
        "jwt_secret": secrets.token_urlsafe(48),
        "api_secret_key": secrets.token_urlsafe(48),
        "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "airflow_passwords.json": json.dumps(
            {"admin": os.environ.get("AIRFLOW_ADMIN_PASSWORD") or secrets.token_urlsafe(16)}),
    }
    for name, value in wanted.items():
        created = _write_once(folder / name, value)
        print(f"{name}: {'created' if created else 'kept'}")
    artifacts = Path(artifacts_dir)
    artifacts.mkdir(parents=True, exist_ok=True)
    for path, mode in ((folder, 0o750), *((item, 0o600) for item in folder.iterdir()), (artifacts, 0o2775)):
        os.chown(path, OWNER_UID, OWNER_GID)
        os.chmod(path, mode)
    print(f"artifacts: {artifacts} (uid {OWNER_UID})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
