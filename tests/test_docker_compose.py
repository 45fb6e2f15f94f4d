"""docker-compose.yaml: the properties that would break the multi-node stack (Docker cannot run here)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

AIRFLOW_SERVICES = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}
RAY_SERVICES = {"ray-head", "ray-worker", "ray-gpu-worker"}
ARTIFACTS = "/shared/artifacts"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _env(service: dict) -> dict:
    env = service.get("environment") or {}
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_compose_has_every_service_of_the_stack(services):
    assert AIRFLOW_SERVICES | RAY_SERVICES | {"postgres", "airflow-init", "ray-ml-init"} <= set(services)
    commands = {name: services[name]["command"] for name in AIRFLOW_SERVICES}
    assert commands == {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                        "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}
    assert "airflow db migrate" in " ".join(services["airflow-init"]["command"])


def test_compose_publishes_ports_on_loopback_only(services):
    published = [(name, port) for name, service in services.items() for port in service.get("ports", [])]
    assert published, "the UI, the Ray dashboard and Serve should be reachable from this machine"
    for name, port in published:
        text = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}"
        assert text.startswith("127.0.0.1:"), (name, port)
    assert "ports" not in services["postgres"]


def test_compose_airflow_services_share_one_env_with_the_postgres_url(services):
    environments = [services[name]["environment"] for name in AIRFLOW_SERVICES | {"airflow-init"}]
    assert all(env is environments[0] for env in environments), "one YAML anchor for every Airflow service"
    env = environments[0]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert "@postgres:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")
    import json

    connection = json.loads(env["AIRFLOW_CONN_RAY_DEFAULT"])
    assert connection["extra"]["dashboard_url"] == "http://ray-head:8265"
    assert connection["extra"]["artifact_root"] == ARTIFACTS == env["RAYML_ARTIFACT_ROOT"]
    # Secrets come from files, the same in every container; none is written in the compose file.
    for name in ("AIRFLOW__API_AUTH__JWT_SECRET_CMD", "AIRFLOW__API__SECRET_KEY_CMD", "AIRFLOW__CORE__FERNET_KEY_CMD"):
        assert env[name].startswith("cat /run/airflow-ray-ml/"), name
    assert "auth_token" not in connection["extra"]


def test_compose_mounts_artifacts_and_the_token_at_the_same_paths_everywhere(services):
    def mounts(name: str) -> dict[str, str]:
        return {entry.split(":")[0]: entry.split(":")[1] for entry in services[name]["volumes"]}

    for name in AIRFLOW_SERVICES | RAY_SERVICES | {"ray-ml-init"}:
        assert mounts(name)["artifacts"] == ARTIFACTS, name
        assert mounts(name)["secrets"] == "/run/airflow-ray-ml", name
    token_paths = {_env(services[name])["RAY_AUTH_TOKEN_PATH"] for name in AIRFLOW_SERVICES | RAY_SERVICES}
    assert token_paths == {"/run/airflow-ray-ml/ray_auth_token"}
    assert all(_env(services[name])["RAY_AUTH_MODE"] == "token" for name in RAY_SERVICES)


def test_compose_gpu_worker_only_in_the_gpu_profile_with_a_device_reservation(services):
    profiled = {name for name, service in services.items() if service.get("profiles")}
    assert profiled == {"ray-gpu-worker"}
    gpu = services["ray-gpu-worker"]
    assert gpu["profiles"] == ["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    assert "--num-gpus=0" in services["ray-worker"]["command"]


def test_compose_waits_on_health_and_one_shot_set_up(services):
    for name in AIRFLOW_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["airflow-init"]["condition"] == "service_completed_successfully", name
        assert "healthcheck" in services[name], name
    assert services["ray-head"]["depends_on"]["ray-ml-init"]["condition"] == "service_completed_successfully"
    assert services["ray-worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"
    for name in ("postgres", "ray-head"):
        assert "healthcheck" in services[name], name


def test_compose_builds_targets_that_the_dockerfile_defines(services):
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE | re.IGNORECASE))
    targets = {service["build"]["target"] for service in services.values() if "build" in service}
    assert targets == {"airflow", "ray"} and targets <= stages
    init_script = services["ray-ml-init"]["command"][1]
    assert "COPY scripts/compose_init.py" in (ROOT / "Dockerfile").read_text() and init_script.endswith("compose_init.py")


@pytest.mark.skipif(shutil.which("docker-compose") is None and shutil.which("docker") is None,
                    reason="no docker compose CLI to validate the file with")
def test_compose_file_is_valid_for_docker_compose():
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run([*command, "version"], capture_output=True, text=True)
        if probe.returncode != 0:
            continue
        result = subprocess.run([*command, "-f", str(ROOT / "docker-compose.yaml"), "--profile", "gpu", "config", "-q"],
                                capture_output=True, text=True, cwd=ROOT)
        assert result.returncode == 0, result.stderr
        return
    pytest.skip("neither `docker compose` nor `docker-compose` works here")


def test_compose_init_creates_secrets_once_and_keeps_them(tmp_path, monkeypatch):
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("compose_init", ROOT / "scripts" / "compose_init.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if os.geteuid() != 0:  # the container runs it as root; only root may hand files to uid 50000
        monkeypatch.setattr(os, "chown", lambda *args: None)
    secrets, artifacts = tmp_path / "secrets", tmp_path / "artifacts"
    assert module.main(str(secrets), str(artifacts)) == 0
    first = {path.name: path.read_text() for path in secrets.iterdir()}
    assert set(first) == {"ray_auth_token", "jwt_secret", "api_secret_key", "fernet_key", "airflow_passwords.json"}
    assert all(value.strip() for value in first.values())
    assert oct((secrets / "ray_auth_token").stat().st_mode & 0o777) == "0o600"
    assert module.main(str(secrets), str(artifacts)) == 0
    assert {path.name: path.read_text() for path in secrets.iterdir()} == first
    import base64
    import json

    assert len(base64.urlsafe_b64decode(first["fernet_key"].strip())) == 32
    assert set(json.loads(first["airflow_passwords.json"])) == {"admin"}
