"""RayHook's calls to a Serve application's endpoint, against a real HTTPS server on loopback.

The server answers like the Serve app (``airflow_ray_ml_stages.serve``) under a route prefix, with a
self-signed certificate made here: the connection's ``verify_tls`` decides whether it is answered.
"""

from __future__ import annotations

import ast
import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from airflow_ray_ml.errors import RayOperatorError, RayTLSError, ServeUnreachableError
from airflow_ray_ml.hooks.ray import RayHook, _tls_context
from airflow_ray_ml.serve_gate import champion_metric
from airflow_ray_ml.serve_schema import ModelSchema
from scripts.localcluster import free_port
from tests.conftest import ROOT

PREFIX = "/tls-app"
API_KEY = "endpoint-key"
VERSION = "xgboost-20260601T120000-ab12cd"
METADATA = {"model_version": VERSION, "task": "regression", "label_column": "quality", "classes": None,
            "data_fingerprint": "fp-1", "metrics": {"test": {"rmse": 0.61}},
            "schema": {"input_columns": ["alcohol"], "numeric": ["alcohol"], "categorical": {}}}


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key, and that key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class _ModelServer(BaseHTTPRequestHandler):
    """``/health``, ``/metadata`` and ``/predict`` under PREFIX, each needing the API key, as the Serve app's."""

    seen_headers: list[dict[str, str]] = []

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, body: dict | None = None) -> None:
        type(self).seen_headers.append({key.lower(): value for key, value in self.headers.items()})
        if self.headers.get("x-api-key") != API_KEY:
            self._reply(401, {"detail": "missing or wrong API key: send it in the X-API-Key header"})
        elif self.path == f"{PREFIX}/health":
            self._reply(200, {"status": "ok", "model_version": VERSION})
        elif self.path == f"{PREFIX}/metadata":
            self._reply(200, METADATA)
        elif self.path == f"{PREFIX}/predict" and body is not None:
            self._reply(200, {"predictions": [5.5] * len(body["instances"]), "model_version": VERSION})
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._answer(json.loads(self.rfile.read(int(self.headers["content-length"]))))

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def https_endpoint(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The server's base URL (what a connection's serve_url names) and its certificate's file."""
    cert_file, key_file = _self_signed(tmp_path_factory.mktemp("tls"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelServer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert_file
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _hook(monkeypatch, serve_url: str, verify_tls: bool) -> RayHook:
    conn_id = f"ray_tls_{'on' if verify_tls else 'off'}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": "http://127.0.0.1:8265", "serve_url": serve_url, "verify_tls": str(verify_tls).lower()}}))
    return RayHook(conn_id, timeout_s=10)


ENDPOINT_CALLS = {
    "health": lambda hook: hook.get_endpoint_health(PREFIX, api_key=API_KEY),
    "metadata": lambda hook: hook.get_endpoint_metadata(PREFIX, api_key=API_KEY),
    "predict": lambda hook: hook.post_endpoint_predict(PREFIX, [{"alcohol": 9.4}], api_key=API_KEY),
}


@pytest.mark.parametrize("call", ENDPOINT_CALLS.values(), ids=ENDPOINT_CALLS.keys())
def test_endpoint_call_self_signed_verify_tls_on_refused_naming_the_setting(monkeypatch, https_endpoint, call):
    serve_url, _ = https_endpoint
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with pytest.raises(RayTLSError) as caught:
        call(_hook(monkeypatch, serve_url, verify_tls=True))
    message = str(caught.value)
    assert f"TLS verification of {serve_url}{PREFIX}/" in message
    assert "certificate verify failed" in message and "verify_tls to false in the connection 'ray_tls_on'" in message
    assert caught.value.__cause__ is None and "Traceback" not in message


def test_endpoint_calls_self_signed_verify_tls_off_answered(monkeypatch, https_endpoint):
    serve_url, _ = https_endpoint
    hook = _hook(monkeypatch, serve_url, verify_tls=False)
    _ModelServer.seen_headers.clear()
    assert ENDPOINT_CALLS["health"](hook).json() == {"status": "ok", "model_version": VERSION}
    assert ENDPOINT_CALLS["metadata"](hook) == METADATA
    predict = ENDPOINT_CALLS["predict"](hook)
    assert predict.status_code == 200 and predict.json()["predictions"] == [5.5]
    # the application's key, never the cluster's token
    assert [headers.get("x-api-key") for headers in _ModelServer.seen_headers] == [API_KEY] * 3
    assert not any("authorization" in headers for headers in _ModelServer.seen_headers)


def test_async_calls_verify_as_the_sync_calls_do_with_one_tls_context_per_ca_bundle(monkeypatch, https_endpoint):
    """The async calls (a trigger's job polls) trust what the sync ones trust (REQUESTS_CA_BUNDLE, as
    the TLS error says), refuse an untrusted certificate with the same error, and make their TLS
    context once per CA bundle instead of once a call."""
    base, cert_file = https_endpoint
    monkeypatch.setenv("AIRFLOW_CONN_RAY_TLS_ASYNC", json.dumps({"conn_type": "ray_ml", "extra": {
        "dashboard_url": base, "verify_tls": "true"}}))
    hook = RayHook("ray_tls_async", timeout_s=10)

    def health() -> int:
        return asyncio.run(hook.a_request("GET", f"{PREFIX}/health", headers={"X-API-Key": API_KEY})).status_code

    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RayTLSError) as caught:
        health()
    assert "certificate verify failed" in str(caught.value) and "connection 'ray_tls_async'" in str(caught.value)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert_file))
    made = _tls_context.cache_info().misses
    assert [health(), health()] == [200, 200]
    assert _tls_context.cache_info().misses == made + 1


def test_endpoint_call_verify_tls_on_with_the_certificate_trusted_answered(monkeypatch, https_endpoint):
    """Verification on is verification, not refusal: a certificate the CA bundle holds is accepted."""
    serve_url, cert_file = https_endpoint
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert_file))
    assert ENDPOINT_CALLS["health"](_hook(monkeypatch, serve_url, verify_tls=True)).status_code == 200


def test_endpoint_metadata_refused_key_raises_with_the_status(monkeypatch, https_endpoint):
    serve_url, _ = https_endpoint
    hook = _hook(monkeypatch, serve_url, verify_tls=False)
    with pytest.raises(RayOperatorError, match=rf"GET {serve_url}{PREFIX}/metadata answered HTTP 401"):
        hook.get_endpoint_metadata(PREFIX, api_key="wrong")


def test_champion_metric_verify_tls_decides_before_any_row(monkeypatch, https_endpoint):
    """The deploy's gate reads the champion through the hook: refused on an unverified certificate,
    and, allowed, it takes the card's metric for rows of the same data."""
    serve_url, _ = https_endpoint
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    schema = ModelSchema.from_metadata(METADATA)
    challenger = {"data_fingerprint": "fp-1", "classes": None}
    with pytest.raises(RayTLSError):
        champion_metric(_hook(monkeypatch, serve_url, True), PREFIX, API_KEY, challenger, "rmse", [], [], schema)
    found = champion_metric(_hook(monkeypatch, serve_url, False), PREFIX, API_KEY, challenger, "rmse", [], [], schema)
    assert found == (0.61, VERSION, [], None)


def test_endpoint_unreachable_names_the_serve_url_and_no_champion(monkeypatch):
    serve_url = f"http://127.0.0.1:{free_port()}"
    hook = _hook(monkeypatch, serve_url, verify_tls=True)
    with pytest.raises(ServeUnreachableError, match=rf"Cannot reach the Serve endpoint {serve_url}{PREFIX}/predict.*"
                                                    r"serve_url of the connection 'ray_tls_on'"):
        hook.post_endpoint_predict(PREFIX, [{"alcohol": 9.4}])
    # nothing served yet: the gate has no champion, as on a first deploy
    schema = ModelSchema.from_metadata(METADATA)
    assert champion_metric(hook, PREFIX, None, {}, "rmse", [], [], schema) == (None, None, [], None)


HTTP_CLIENTS = {"requests", "httpx", "aiohttp", "urllib3", "urllib.request", "http.client"}


def _http_imports(path: Path) -> list[str]:
    """The HTTP client modules ``path`` imports, but those imported for type annotations only."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(node) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                   for statement in block.body for node in ast.walk(statement)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found += [name for name in names if name in HTTP_CLIENTS or name.split(".")[0] in HTTP_CLIENTS - {"urllib"}]
    return found


def test_operators_send_http_only_through_the_hook():
    """Every request of the Airflow side goes through RayHook (its TLS setting, auth and timeout)."""
    offenders = {str(path.relative_to(ROOT)): _http_imports(path)
                 for path in sorted((ROOT / "operators").rglob("*.py")) if "hooks" not in path.parts}
    assert {path: names for path, names in offenders.items() if names} == {}
    assert _http_imports(ROOT / "operators" / "hooks" / "ray.py")  # the check sees an import where there is one
