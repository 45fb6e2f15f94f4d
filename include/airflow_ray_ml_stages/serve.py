"""The Ray Serve application that answers predictions for one trained model.

``build_app`` is the application builder named in the declarative Serve config
(``import_path: airflow_ray_ml_stages.serve:build_app``). The model directory and version travel in the
deployment's ``user_config``, so promoting a new model of the same code is a ``reconfigure()`` on
the live replicas, not a restart. Routes, under the application's route prefix:

* ``POST /predict`` — ``{"instances": [{"<feature>": value, ...}, ...]}`` (1 to ``MAX_INSTANCES``
  rows, each with every input column and nothing else). A regression model answers
  ``{"predictions": [<number>, ...], "model_version"}``; a classification model
  ``{"predictions": [<class>, ...], "probabilities": [[<p>, ...], ...], "classes", "model_version"}``
  (each row's most probable class, and every class's probability in ``classes`` order).
* ``GET /openapi.json`` — this contract for the loaded model: one property per feature (numbers,
  JSON booleans for a boolean column, or the training categories as an enum), the row limit, and the responses of the model's task. What
  the schema allows is what ``/predict`` accepts: the body is checked against that same schema.
  ``GET /docs`` renders it.
* ``GET /health`` — 200 with the model version once a model is loaded.
* ``GET /metadata`` — the model card (version, family, task, classes, metrics, trained-at) and the
  input schema.
* ``GET /rollout`` — while a challenger runs in shadow or canary, what it and the champion answered
  (:class:`airflow_ray_ml_stages.rollout.RolloutStats`; ``?rows=1`` adds the kept rows); 404 when none runs.

The application is a deployment graph: the ingress ``ModelServer`` answers with the champion, which
it loads itself (so a client's answer takes no extra hop), and holds a handle to the ``Challenger``
deployment. With no rollout the challenger has no model and scales to zero replicas. A rollout in
the ingress's ``user_config`` (``{"mode": "shadow"|"canary", "share", "challenger_version"}``) routes
``share`` of the ``/predict`` requests to it: in shadow, after the champion answered, without
waiting for it; in canary, instead of the champion, whose answer the client gets when the
challenger fails or takes longer than ``CANARY_TIMEOUT_S``.

Every answer is JSON of a declared shape: 200, 401 (wrong or missing API key), 422
(``{"detail": [{"loc", "msg", "type"}, ...]}``: a body that is not JSON, breaks the schema, or
gets no finite prediction) or 503 (no model loaded yet); never a 5xx for bad input.

(No ``from __future__ import annotations`` here: FastAPI resolves the route signatures' types from
the live annotations.)

Requests are batched with ``@serve.batch``; preprocessing is the saved JSON statistics applied
with numpy (:class:`airflow_ray_ml_stages.preprocessor.Preprocessor`). An API key, when configured, is checked on
every route but ``/docs`` (``X-API-Key`` header or ``Authorization: Bearer``); only its SHA-256 is in the config.
"""

import asyncio
import hashlib
import hmac
import json
import math
import reprlib
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from airflow_ray_ml_stages.constants import TASKS
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.rollout import ROLLOUT_MODES, ChampionCounts, RolloutStats, ShareTaker, row_keys

APP_IMPORT_PATH = "airflow_ray_ml_stages.serve:build_app"
DEPLOYMENT_NAME = "ModelServer"
CHALLENGER_DEPLOYMENT = "Challenger"
CANARY_TIMEOUT_S = 2.0  # a canary request the challenger has not answered by then gets the champion's answer
MAX_PENDING_MIRRORS = 8  # mirror calls an ingress replica has pending at once; beyond, it skips mirroring
# An ingress replica sends the requests answered within this long as one mirror call, of at most
# MAX_MIRROR_ROWS rows (beyond, requests are not mirrored until it went). Every call costs the
# ingress and the challenger a Serve hop on the champion's CPUs: one a second kept a shadow within
# the clients' p50 noise where one per 100 ms added a fifth (bench/bench_shadow.py).
MIRROR_WAIT_S = 1.0
MAX_MIRROR_ROWS = 10_000
# The challenger's deployment while no rollout runs: no model and no replica (the deploy lists it
# so in every config it puts: airflow_ray_ml.serve_rollout.IDLE_AUTOSCALING, kept equal by a test).
IDLE_AUTOSCALING = {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0, "downscale_delay_s": 1,
                    "downscale_to_zero_delay_s": 1, "look_back_period_s": 2, "metrics_interval_s": 1}
MAX_INSTANCES = 1024
MAX_PROBLEMS = 100  # a 422 lists at most this many problems
BATCH_SIZE = 32
BATCH_WAIT_S = 0.0  # no added wait for a lone request; batches form from the queue under load
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_short = reprlib.Repr()  # bad values quoted in messages: nested junk stays short, and never recurses deeply
_short.maxlevel, _short.maxstring, _short.maxother, _short.maxlist, _short.maxdict = 2, 60, 60, 5, 5


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def problem(loc: list[str | int], msg: str, kind: str) -> dict[str, Any]:
    """One entry of a 422's ``detail``."""
    return {"loc": list(loc), "msg": msg, "type": kind}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send finite numbers")


def read_json_body(body: bytes, content_type: str) -> tuple[Any, list[dict[str, Any]]]:
    """The decoded request body, or the problem with it (strict JSON: no NaN or Infinity tokens)."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        return None, [problem(["header", "content-type"], "send the body as JSON with Content-Type: "
                              f"application/json, got {media_type or 'none'!r}", "content_type")]
    if not body.strip():
        return None, [problem(["body"], 'the body is empty; send {"instances": [{"<feature>": value, ...}]}',
                              "json_invalid")]
    try:
        return json.loads(body, parse_constant=_refuse_constant), []
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, [problem(["body"], f"not valid JSON: {str(err)[:200]}", "json_invalid")]


def _as_float(number: int | float | None) -> float:
    """A JSON number as a float; an integer beyond float64's range (JSON has none) as an infinity; null as NaN."""
    if number is None:
        return math.nan
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf


def _finite_or_none(data: Any) -> Any:
    """``data`` with non-finite floats as None: JSON has no NaN (a card's metric may be one)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite_or_none(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_none(value) for value in data]
    return data


# -- the schemas every model shares ------------------------------------------------------------

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error", "type": "object", "required": ["detail"], "additionalProperties": False,
    "properties": {"detail": {"type": "string"}},
}
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "title": "ValidationError", "type": "object", "required": ["detail"], "additionalProperties": False,
    "properties": {"detail": {"type": "array", "minItems": 1, "maxItems": MAX_PROBLEMS, "items": {
        "type": "object", "required": ["loc", "msg", "type"], "additionalProperties": False,
        "properties": {
            "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    "description": "where: 'body', 'instances', the row's index, the feature"},
            "msg": {"type": "string", "description": "what is wrong and what is allowed"},
            "type": {"type": "string", "description": "the kind of problem: missing, extra_forbidden, "
                     "enum, number_type, too_long, json_invalid, content_type, ..."},
        }}}},
}
HEALTH_SCHEMA: dict[str, Any] = {
    "title": "Health", "type": "object", "required": ["status", "model_version"], "additionalProperties": False,
    "properties": {"status": {"const": "ok"}, "model_version": {"type": "string"}},
}
_NULLABLE_STRING = {"type": ["string", "null"]}
METADATA_SCHEMA: dict[str, Any] = {
    "title": "Metadata", "type": "object",
    "required": ["model_version", "family", "task", "classes", "metrics", "trained_at", "label_column",
                 "data_fingerprint", "config", "schema"],
    "properties": {
        "model_version": _NULLABLE_STRING, "family": {"type": "string"}, "task": {"enum": list(TASKS)},
        "classes": {"type": ["array", "null"]}, "trained_at": _NULLABLE_STRING,
        "metrics": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": {"type": ["number", "null"]}}},
        "label_column": {"type": "string"}, "data_fingerprint": _NULLABLE_STRING,
        "config": {"type": "object"}, "schema": {"type": "object"},
    },
}

# A 422's ``type`` for a value of the wrong JSON type, by the type expected.
_TYPE_KINDS = {"number": "number_type", "object": "dict_type", "array": "list_type", "string": "string_type",
               "boolean": "bool_type"}


@dataclass
class LoadedModel:
    """A model directory made ready to predict from raw feature rows, with its request/response contract."""

    model: Any
    preprocessor: Any
    card: ModelCard

    @classmethod
    def load(cls, model_dir: str) -> "LoadedModel":
        from airflow_ray_ml_stages import artifacts
        from airflow_ray_ml_stages.models import load_model
        from airflow_ray_ml_stages.preprocessor import Preprocessor

        model = load_model(model_dir)
        preprocessor = Preprocessor.load(artifacts.join(model_dir, "preprocessor.json"))
        return cls(model=model, preprocessor=preprocessor, card=model.card)

    @property
    def version(self) -> str:
        return self.card.model_version or ""

    @property
    def input_columns(self) -> list[str]:
        return list(self.preprocessor.input_columns)

    @property
    def classification(self) -> bool:
        return self.card.task == "classification"

    def schema(self) -> dict[str, Any]:
        return {
            "input_columns": self.input_columns,
            "numeric": list(self.preprocessor.numeric_columns),
            "boolean": list(self.preprocessor.boolean_columns),
            "categorical": {column: list(values) for column, values in self.preprocessor.categories.items()},
            "max_instances": MAX_INSTANCES,
        }

    def metadata(self) -> dict[str, Any]:
        keys = ("model_version", "family", "task", "classes", "metrics", "trained_at", "label_column",
                "data_fingerprint", "config")
        return _finite_or_none({**{key: getattr(self.card, key) for key in keys}, "schema": self.schema()})

    # -- the contract ---------------------------------------------------------------------------

    @cached_property
    def request_schema(self) -> dict[str, Any]:
        """JSON Schema (2020-12) of a ``/predict`` body: the one that bodies are checked against."""
        # a model trained with nan_policy='impute' takes null for a missing value and imputes it as trained
        fill = self.preprocessor.fill
        nullable = " (null: missing, imputed as in training)" if fill else ""
        features: dict[str, Any] = {
            column: {"type": ["number", "null"] if column in fill else "number",
                     "description": "a number (the model computes in float32: one beyond its range counts as the "
                                    f"largest float32){nullable}"}
            for column in self.preprocessor.numeric_columns
        }
        for column in self.preprocessor.boolean_columns:
            features[column] = {"type": ["boolean", "null"] if column in fill else "boolean",
                                "description": f"true or false{nullable}"}
        for column, values in self.preprocessor.categories.items():
            features[column] = {"type": ["string", "null"] if column in fill else "string",
                                "enum": [*values, *([None] if column in fill else [])],
                                "description": f"a category seen in training{nullable}"}
        row = {"title": "Row", "type": "object", "properties": features, "required": self.input_columns,
               "additionalProperties": False, "description": "one row: every input column, by name"}
        return {
            "title": "PredictRequest", "type": "object", "required": ["instances"], "additionalProperties": False,
            "properties": {"instances": {"type": "array", "items": row, "minItems": 1, "maxItems": MAX_INSTANCES}},
        }

    @cached_property
    def prediction_schema(self) -> dict[str, Any]:
        """JSON Schema of a 200 answer of ``/predict``, for the model's task."""
        rows = {"minItems": 1, "maxItems": MAX_INSTANCES}
        properties: dict[str, Any] = {"model_version": {"type": "string"}}
        if self.classification:
            classes = list(self.card.classes or [])
            properties["predictions"] = {"type": "array", "items": {"enum": classes}, **rows,
                                         "description": "each row's most probable class"}
            properties["probabilities"] = {"type": "array", **rows, "description": "each row's probability of "
                                           "every class, in the order of classes (a row sums to 1)",
                                           "items": {"type": "array", "minItems": len(classes),
                                                     "maxItems": len(classes),
                                                     "items": {"type": "number", "minimum": 0, "maximum": 1}}}
            properties["classes"] = {"const": classes, "description": "the label's classes"}
        else:
            properties["predictions"] = {"type": "array", "items": {"type": "number"}, **rows}
        return {"title": "Prediction", "type": "object", "required": list(properties), "additionalProperties": False,
                "properties": properties}

    def openapi(self, root_path: str = "", api_key: bool = False) -> dict[str, Any]:
        """The OpenAPI 3.1 document of the application serving this model."""
        schemas = {"PredictRequest": self.request_schema, "Prediction": self.prediction_schema,
                   "ValidationError": VALIDATION_ERROR_SCHEMA, "Error": ERROR_SCHEMA,
                   "Health": HEALTH_SCHEMA, "Metadata": METADATA_SCHEMA}

        def answer(description: str, schema: str) -> dict[str, Any]:
            return {"description": description,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}

        common = {"503": answer("no model loaded yet", "Error")}
        if api_key:
            common["401"] = answer("missing or wrong API key", "Error")
        security = {"security": [{"ApiKey": []}, {"Bearer": []}]} if api_key else {}
        what = f"{self.card.task} of {self.card.label_column!r}"
        document: dict[str, Any] = {
            "openapi": "3.1.0",
            "info": {"title": f"Model server: {what}", "version": self.version or "unknown",
                     "description": f"Predictions of a {self.card.family} model ({what})."},
            "paths": {
                "/predict": {"post": {
                    "operationId": "predict", "summary": f"Predict the {what} of up to {MAX_INSTANCES} rows",
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/PredictRequest"}}}},
                    "responses": {"200": answer("the predictions, one per row", "Prediction"),
                                  "422": answer("the body is not JSON, breaks the request schema, or a row "
                                                "gets no finite prediction", "ValidationError"), **common},
                    **security}},
                "/health": {"get": {"operationId": "health", "summary": "The served model's version",
                                    "responses": {"200": answer("a model is loaded", "Health"), **common},
                                    **security}},
                "/metadata": {"get": {"operationId": "metadata", "summary": "The model card and input schema",
                                      "responses": {"200": answer("the model card", "Metadata"), **common},
                                      **security}},
            },
            "components": {"schemas": schemas},
        }
        if api_key:
            document["components"]["securitySchemes"] = {
                "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "Bearer": {"type": "http", "scheme": "bearer"}}
        if root_path:
            document["servers"] = [{"url": root_path}]
        return document

    # -- checking requests ----------------------------------------------------------------------

    @cached_property
    def _validator(self):
        from jsonschema import Draft202012Validator

        return Draft202012Validator(self.request_schema)

    @cached_property
    def _allowed(self) -> tuple[frozenset[str], tuple[str, ...], tuple[str, ...], dict[str, frozenset[str]]]:
        categories = {column: frozenset(values) for column, values in self.preprocessor.categories.items()}
        return (frozenset(self.input_columns), tuple(self.preprocessor.numeric_columns),
                tuple(self.preprocessor.boolean_columns), categories)

    def _row_fits(self, row: Any) -> bool:
        """A quick check, no looser than the schema, that passes the rows of a good request."""
        columns, numeric, boolean, categories = self._allowed
        if type(row) is not dict or row.keys() != columns:
            return False
        for column in numeric:
            value = row[column]
            if type(value) not in (int, float):
                return False
        if any(type(row[column]) is not bool for column in boolean):
            return False
        return all(type(row[column]) is str and row[column] in allowed for column, allowed in categories.items())

    def check_body(self, body: Any) -> tuple[pd.DataFrame | None, list[dict[str, Any]]]:
        """The rows of a decoded ``/predict`` body as a frame, or its problems: the request schema decides."""
        instances = body.get("instances") if isinstance(body, dict) else None
        if isinstance(instances, list) and len(instances) > MAX_INSTANCES:  # no need to look at every row
            return None, [problem(["body", "instances"], f"at most {MAX_INSTANCES} rows a request, got "
                                  f"{len(instances)}: split them into several requests", "too_long")]
        quick = (isinstance(body, dict) and len(body) == 1 and isinstance(instances, list) and instances
                 and all(self._row_fits(row) for row in instances))
        if not quick:  # the quick check is only a fast path: the schema has the last word
            if not isinstance(body, dict):  # (jsonschema would quote all of it in its message)
                return None, [problem(["body"], 'must be an object: {"instances": [...]}, got '
                                      f"{_short.repr(body)}", "dict_type")]
            try:
                problems = self._problems(body)
            except RecursionError:  # jsonschema quotes a bad value whole, and junk may be nested deeply
                problems = [problem(["body"], "nested too deeply to be a request", "json_invalid")]
            if problems:
                return None, problems
        try:
            frame = pd.DataFrame(instances, columns=self.input_columns)
        except OverflowError:  # pandas 2 on an integer beyond float64 (pandas 3 keeps it as an object)
            numeric = set(self.preprocessor.numeric_columns)
            frame = pd.DataFrame([{key: _as_float(value) if key in numeric and type(value) is int else value
                                   for key, value in row.items()} for row in instances], columns=self.input_columns)
        for column in self.preprocessor.numeric_columns:
            if frame[column].dtype == object:  # integers beyond int64; those beyond float64 too
                frame[column] = [_as_float(value) for value in frame[column]]
        return frame, []

    def validate(self, instances: list[Any]) -> tuple[pd.DataFrame | None, list[dict[str, Any]]]:
        """Check raw rows against the request schema; return the frame or the field-level problems."""
        return self.check_body({"instances": instances})

    def _problems(self, body: Any) -> list[dict[str, Any]]:
        """Each way ``body`` breaks the request schema, in words a client can act on."""
        columns = self.input_columns
        problems = []
        for error in self._validator.iter_errors(body):
            where = ["body", *error.absolute_path]
            in_row = len(where) == 3  # body, instances, the row's index
            keyword, expected, value = error.validator, error.validator_value, error.instance
            if keyword == "required":
                for name in [name for name in expected if name not in value]:
                    problems.append(problem([*where, name], "missing feature" if in_row else
                                            'missing; send {"instances": [{"<feature>": value, ...}]}', "missing"))
            elif keyword == "additionalProperties":
                for name in sorted(set(value) - set(error.schema.get("properties", {}))):
                    problems.append(problem([*where, name], f"unknown feature; expected {columns}" if in_row else
                                            "unknown field; the body has only 'instances'", "extra_forbidden"))
            elif keyword == "enum":
                problems.append(problem(where, f"must be one of {expected}, got {_short.repr(value)}", "enum"))
            elif keyword == "type" and expected in ("number", ["number", "null"]):
                problems.append(problem(where, f"must be a number{' or null' if expected != 'number' else ''}, got "
                                        f"{_short.repr(value)}", "number_type"))
            elif keyword == "type" and expected in ("boolean", ["boolean", "null"]):
                problems.append(problem(where, f"must be true or false (a JSON boolean)"
                                        f"{' or null' if expected != 'boolean' else ''}, got {_short.repr(value)}",
                                        "bool_type"))
            elif keyword == "type" and in_row:
                problems.append(problem(where, f"a row must be an object of feature: value with every input column "
                                        f"{columns} (rows as lists are not accepted), got {_short.repr(value)}",
                                        "dict_type"))
            elif keyword == "type":
                if isinstance(expected, list):  # a nullable feature: ["string", "null"]
                    what, kind = " or ".join(expected), _TYPE_KINDS.get(expected[0], "type")
                else:
                    what = {"object": 'an object: {"instances": [...]}', "array": "a list of rows"}.get(expected,
                                                                                                      expected)
                    kind = _TYPE_KINDS.get(expected, "type")
                problems.append(problem(where, f"must be {what}, got {_short.repr(value)}", kind))
            elif keyword == "minItems":
                problems.append(problem(where, "send at least one row", "too_short"))
            elif keyword == "maxItems":
                problems.append(problem(where, f"at most {MAX_INSTANCES} rows a request; split them into several "
                                        "requests", "too_long"))
            else:  # a keyword the request schema does not use today
                problems.append(problem(where, f"breaks the schema's {keyword!r}: {_short.repr(expected)}", keyword))
            if len(problems) >= MAX_PROBLEMS:
                break
        # one schema error may name several fields (each missing or unknown feature of a row)
        return problems[:MAX_PROBLEMS]

    # -- predicting -----------------------------------------------------------------------------

    def predict_frame(self, frame: pd.DataFrame) -> np.ndarray:
        """The model's output for raw rows: one number per row (regression), or rows x classes
        probabilities in ``card.classes`` order (classification)."""
        with np.errstate(over="ignore"):  # huge inputs scale to infinity, clipped below
            features = self.preprocessor.transform(frame)[self.card.feature_columns].to_numpy(dtype="float64")
            # Finite inputs far outside the training range stay finite in the model's float32.
            features = np.clip(features, -_FLOAT32_MAX, _FLOAT32_MAX).astype("float32")
            predicted = np.asarray(self.model.predict(features), dtype="float64")
        return predicted.reshape(len(frame), -1) if self.classification else predicted.reshape(-1)

    def answer(self, predictions: np.ndarray) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The 200 body for :meth:`predict_frame`'s output, or a problem per row that got no finite prediction."""
        finite = np.isfinite(predictions).reshape(len(predictions), -1).all(axis=1)
        if not finite.all():
            return None, [problem(["body", "instances", int(index)], "the model gives no finite prediction for "
                                  "this row: its values are far outside the data it was trained on",
                                  "non_finite_prediction") for index in np.flatnonzero(~finite)[:MAX_PROBLEMS]]
        if not self.classification:
            return {"predictions": predictions.tolist(), "model_version": self.version}, []
        classes = list(self.card.classes or [])
        return {"predictions": [classes[index] for index in predictions.argmax(axis=1).tolist()],
                "probabilities": predictions.tolist(), "classes": classes, "model_version": self.version}, []


def predict_grouped(requests: list[tuple[LoadedModel, pd.DataFrame]]) -> list[tuple[np.ndarray, float]]:
    """One batch of ``(model, frame)`` requests predicted together, each with the milliseconds its
    model took (for the batch it was in); requests of one batch may straddle a reconfigure, so they
    are grouped by the model they saw."""
    results: list[tuple[np.ndarray, float] | None] = [None] * len(requests)
    for model in {id(model): model for model, _ in requests}.values():
        started = time.perf_counter()
        members = [i for i, (m, _) in enumerate(requests) if m is model]
        frames = [requests[i][1] for i in members]
        predictions = model.predict_frame(pd.concat(frames, ignore_index=True))
        bounds = np.cumsum([0, *(len(frame) for frame in frames)])
        took_ms = (time.perf_counter() - started) * 1000
        for position, index in enumerate(members):
            results[index] = (predictions[bounds[position]:bounds[position + 1]], took_ms)
    return results


def load_checked(config: dict[str, Any]) -> LoadedModel:
    """The model a ``user_config`` names (``model_dir``), checked to be its ``model_version``."""
    model = LoadedModel.load(config["model_dir"])
    expected = str(config.get("model_version") or "")
    if expected and model.version != expected:
        raise ValueError(f"model in {config['model_dir']} is version {model.version!r}, the config says {expected!r}")
    model.openapi()  # build (and cache) the schemas now, not on the first request
    return model


def rollout_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The rollout a ``user_config`` asks for, checked; None for none."""
    rollout = config.get("rollout")
    if not rollout:
        return None
    mode, share = rollout.get("mode"), rollout.get("share")
    if mode not in ROLLOUT_MODES or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"rollout must name a mode of {list(ROLLOUT_MODES)} and a share in (0, 1], got {rollout!r}")
    return {"mode": mode, "share": float(share), "challenger_version": str(rollout.get("challenger_version") or "")}


def bind_replica_grpc_to_the_node() -> None:
    """Have this replica's inter-deployment gRPC server listen on its node's address, not on every interface.

    Ray Serve 2.60's replica binds that server to ``[::]:0`` when it has started, once its
    deployment's constructor has run (``ray.serve._private.replica``). The port is reported to the
    controller with the replica's node address, which is where other nodes reach it: the node's
    address (127.0.0.1 on the local stack) serves every caller, and a laptop's cluster is not
    offered to its network. Called by each deployment's constructor; where Ray's code differs (no
    such helper), nothing changes. docs/deployment.md#listening-sockets.
    """
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "binds_to_the_node", False):
        return
    import ray

    node_ip = ray.util.get_node_ip_address()
    host = f"[{node_ip}]" if ":" in node_ip else node_ip

    def add_port_on_the_node(server: Any, address: str) -> int:
        if address.startswith("[::]:"):
            address = f"{host}:{address.rsplit(':', 1)[1]}"
        return original(server, address)

    add_port_on_the_node.binds_to_the_node = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port_on_the_node


def build_app(args: dict[str, Any]):
    """Serve application builder: ``args`` may carry ``api_key_sha256``."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import Response
    from ray import serve

    # The OpenAPI document depends on the model, which reconfigure() loads after the app is built:
    # it is served by a route of the deployment, not by FastAPI's own (disabled) one.
    api = FastAPI(title="airflow_ray_ml_stages model server", openapi_url=None, docs_url=None, redoc_url=None)

    def reply(content: Any, status_code: int = 200) -> Response:
        # ASCII-only: a lone surrogate in a client's feature name is echoed back without failing to encode.
        body = json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return Response(body.encode("ascii"), status_code=status_code, media_type="application/json")

    @api.exception_handler(RequestValidationError)
    async def validation_failed(request: Request, exc: RequestValidationError) -> Response:
        # No route takes parameters FastAPI validates; should one ever, its 422 keeps the declared shape.
        errors = [problem([str(p) if not isinstance(p, int) else p for p in error.get("loc", ())],
                          str(error.get("msg", "")), str(error.get("type", "invalid")))
                  for error in exc.errors()] or [problem(["body"], "invalid request", "invalid")]
        return reply({"detail": errors[:MAX_PROBLEMS]}, 422)

    # Idle unless a rollout's config says otherwise: no replica, and none kept once a rollout ends.
    @serve.deployment(name=CHALLENGER_DEPLOYMENT, autoscaling_config=IDLE_AUTOSCALING,
                      ray_actor_options={"num_cpus": 0.1})
    class Challenger:
        """The model tried beside the champion, and the record of how both answered (:class:`RolloutStats`)."""

        def __init__(self) -> None:
            bind_replica_grpc_to_the_node()
            self._model: LoadedModel | None = None
            self._stats: RolloutStats | None = None

        def reconfigure(self, config: dict[str, Any]) -> None:
            """Load the challenger a rollout names (``{"challenger": {"model_dir", "model_version"},
            "rollout"}``), or none (``{}``); each rollout starts a new record."""
            rollout = rollout_of(config)
            if not config.get("challenger") or rollout is None:
                self._model, self._stats = None, None
                return
            model = load_checked(config["challenger"])
            self._model = model
            self._stats = RolloutStats(rollout["mode"], rollout["share"], model.version, model.classification)

        async def _answer(self, frame: pd.DataFrame, counts: dict[str, Any], champion: dict[str, Any] | None,
                          requests: int = 1, sample_rows: int = 0) -> dict[str, Any] | None:
            model, stats = self._model, self._stats
            if model is None or stats is None:
                return None
            stats.add_champion(counts)
            try:
                predictions, took_ms = await self._predict_batched((model, frame))
                if sample_rows:
                    # A mirrored call's rows are predicted together, in a batch far larger than the
                    # champion's: its answer time is one request's rows predicted alone, as the
                    # champion answered them.
                    took_ms = predict_grouped([(model, frame.iloc[:sample_rows])])[0][1]
                answer, problems = model.answer(predictions)
            except Exception as err:  # the challenger's own failure: counted, never the client's
                stats.add_failure(len(frame), f"{type(err).__name__}: {err}", requests)
                return None
            if answer is None:
                stats.add_failure(len(frame), f"no finite prediction: {problems[:3]}", requests)
                return None
            keys = row_keys(frame, model.input_columns, list(model.preprocessor.boolean_columns)) \
                if champion is not None else []
            stats.add_answer(keys, answer, took_ms, champion, requests)
            return answer

        async def shadow(self, frame: pd.DataFrame, champion: dict[str, Any], requests: int,
                         counts: dict[str, Any], first_rows: int) -> None:
            """Answer the rows of ``requests`` mirrored requests (together; the first request's are
            the first ``first_rows``) and compare with the champion's answer to them (``champion``:
            its answers joined in the same order)."""
            if self._stats is not None and self._stats.mode == "shadow":  # not a call the last trial left
                await self._answer(frame, counts, champion, requests, sample_rows=first_rows)

        async def canary(self, frame: pd.DataFrame, counts: dict[str, Any]) -> dict[str, Any] | None:
            """Answer a client's rows; None when the challenger could not (the champion answers then)."""
            if self._stats is None or self._stats.mode != "canary":
                return None
            return await self._answer(frame, counts, None)

        def stats(self, with_rows: bool = False) -> dict[str, Any] | None:
            return self._stats.summary(with_rows) if self._stats is not None else None

        @serve.batch(max_batch_size=BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
        async def _predict_batched(self, requests: list[tuple[LoadedModel, pd.DataFrame]]) -> list[tuple[np.ndarray, float]]:
            return predict_grouped(requests)

    @serve.deployment(name=DEPLOYMENT_NAME)
    @serve.ingress(api)
    class ModelServer:
        def __init__(self, api_key_sha256: str | None = None, challenger: Any = None) -> None:
            bind_replica_grpc_to_the_node()
            self._api_key_sha256 = api_key_sha256 or None
            self._model: LoadedModel | None = None
            self._challenger = challenger  # the Challenger deployment's handle
            self._rollout: tuple[str, ShareTaker] | None = None
            self._champion_counts = ChampionCounts()
            self._mirrors: set[asyncio.Future] = set()  # mirror calls pending
            self._to_mirror: list[tuple[pd.DataFrame, dict[str, Any]]] = []  # answered, not sent yet
            self._mirror_rows = 0  # rows in _to_mirror

        def reconfigure(self, config: dict[str, Any]) -> None:
            """Load the model named by ``user_config`` and route as its rollout says; a broken artifact fails the deployment."""
            model = load_checked(config)
            rollout = rollout_of(config)
            # one assignment each: requests see the old model or the new, never half
            self._rollout = (rollout["mode"], ShareTaker(rollout["share"])) if rollout else None
            self._model = model

        def _denied(self, request: Request) -> Response | None:
            if not self._api_key_sha256:
                return None
            given = request.headers.get("x-api-key") or ""
            if not given and request.headers.get("authorization", "").lower().startswith("bearer "):
                given = request.headers["authorization"][7:]
            if given and hmac.compare_digest(hash_api_key(given), self._api_key_sha256):
                return None
            return reply({"detail": "missing or wrong API key: send it in the X-API-Key header"}, 401)

        def _loaded(self, request: Request) -> LoadedModel | Response:
            if (denied := self._denied(request)) is not None:
                return denied
            if self._model is None:
                return reply({"detail": "no model loaded yet"}, 503)
            return self._model

        @api.get("/health")
        async def health(self, request: Request):
            model = self._loaded(request)
            return model if isinstance(model, Response) else reply({"status": "ok", "model_version": model.version})

        @api.get("/metadata")
        async def metadata(self, request: Request):
            model = self._loaded(request)
            return model if isinstance(model, Response) else reply(model.metadata())

        @api.get("/rollout", include_in_schema=False)
        async def rollout(self, request: Request):
            model = self._loaded(request)
            if isinstance(model, Response):
                return model
            stats = None
            if self._rollout is not None and self._challenger is not None:
                stats = await self._challenger.stats.remote(request.query_params.get("rows") == "1")
            if stats is None:
                return reply({"detail": "no challenger runs beside the champion"}, 404)
            return reply(_finite_or_none({**stats, "champion_version": model.version}))

        @api.get("/openapi.json", include_in_schema=False)
        async def openapi(self, request: Request):
            model = self._loaded(request)
            if isinstance(model, Response):
                return model
            return reply(model.openapi(request.scope.get("root_path", ""), api_key=bool(self._api_key_sha256)))

        @api.get("/docs", include_in_schema=False)
        async def docs(self, request: Request):
            return get_swagger_ui_html(openapi_url=f"{request.scope.get('root_path', '')}/openapi.json",
                                       title="model server")

        @api.post("/predict")
        async def predict(self, request: Request):
            model = self._loaded(request)
            if isinstance(model, Response):
                return model
            body, problems = read_json_body(await request.body(), request.headers.get("content-type", ""))
            frame = None
            if not problems:
                frame, problems = model.check_body(body)
            if problems:
                return reply({"detail": problems}, 422)
            rollout = self._rollout
            if rollout is not None and rollout[0] == "canary" and rollout[1].take():
                answer = await self._canary(frame)
                if answer is not None:
                    return reply(answer)
            predictions, took_ms = await self._predict_batched((model, frame))
            answer, problems = model.answer(predictions)
            self._champion_counts.add(answer is None, took_ms)
            if answer is not None and rollout is not None and rollout[0] == "shadow" and rollout[1].take():
                self._mirror(frame, answer)
            return reply(answer) if answer is not None else reply({"detail": problems}, 422)

        async def _canary(self, frame: pd.DataFrame) -> dict[str, Any] | None:
            """The challenger's answer to a client's rows, or None when it gave none in time."""
            try:
                return await asyncio.wait_for(self._challenger.canary.remote(frame, self._champion_counts.take()),
                                              CANARY_TIMEOUT_S)
            # an unreachable, slow or stopping challenger (a call to a replica that stops is
            # cancelled, which is no Exception): the champion answers
            except (Exception, asyncio.CancelledError):
                return None

        def _mirror(self, frame: pd.DataFrame, answer: dict[str, Any]) -> None:
            """Queue rows the champion answered for the challenger; the requests answered within
            ``MIRROR_WAIT_S`` go in one call, which no client waits for."""
            if len(self._mirrors) >= MAX_PENDING_MIRRORS:
                return  # the challenger lags: the champion's clients come first
            if self._mirror_rows + len(frame) > MAX_MIRROR_ROWS:
                return  # this call is full; the next one starts when it has gone
            self._to_mirror.append((frame, answer))
            self._mirror_rows += len(frame)
            if len(self._to_mirror) == 1:
                task = asyncio.ensure_future(self._send_mirrored(self._rollout))
                self._mirrors.add(task)
                task.add_done_callback(self._mirrors.discard)

        async def _send_mirrored(self, rollout: tuple[str, ShareTaker] | None) -> None:
            await asyncio.sleep(MIRROR_WAIT_S)
            batch, self._to_mirror, self._mirror_rows = self._to_mirror, [], 0
            if self._rollout is not rollout:
                return  # the trial these requests were answered in has ended: they belong to no record
            frame = pd.concat([frame for frame, _ in batch], ignore_index=True) if len(batch) > 1 else batch[0][0]
            answers = [answer for _, answer in batch]
            champion = {key: [value for answer in answers for value in answer[key]]
                        for key in ("predictions", "probabilities") if key in answers[0]}
            champion["classes"] = answers[0].get("classes")
            try:
                await self._challenger.shadow.remote(frame, champion, len(batch), self._champion_counts.take(),
                                                     len(batch[0][0]))
            except (Exception, asyncio.CancelledError):  # the challenger records its own failures
                pass

        @serve.batch(max_batch_size=BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
        async def _predict_batched(self, requests: list[tuple[LoadedModel, pd.DataFrame]]) -> list[tuple[np.ndarray, float]]:
            return predict_grouped(requests)

    return ModelServer.bind(api_key_sha256=args.get("api_key_sha256"), challenger=Challenger.bind())
