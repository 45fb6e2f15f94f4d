"""The Ray Serve application that answers predictions for one trained model.

``build_app`` is the application builder named in the declarative Serve config
(``import_path: airflow_ray_ml_stages.serve:build_app``). The model directory and version travel in the
deployment's ``user_config``, so promoting a new model of the same code is a ``reconfigure()`` on
the live replicas, not a restart. Routes, under the application's route prefix:

* ``POST /predict`` — ``{"instances": [{"<feature>": value, ...}, ...]}`` or rows as lists in
  the order of ``/metadata``'s ``input_columns``; answers ``{"predictions": [...], "model_version"}``.
  Bad input gets a 4xx with a message per offending field, never a 5xx.
* ``GET /health`` — 200 with the model version once a model is loaded.
* ``GET /metadata`` — the model card (version, family, metrics, trained-at) and the input schema.

(No ``from __future__ import annotations`` here: FastAPI resolves the route signatures' types, which
are defined inside :func:`build_app`, from the live annotations.)

Requests are batched with ``@serve.batch``; preprocessing is the saved JSON statistics applied
with numpy (:class:`airflow_ray_ml_stages.preprocessor.Preprocessor`). An API key, when configured, is checked on
every route (``X-API-Key`` header or ``Authorization: Bearer``); only its SHA-256 is in the config.
"""

import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from airflow_ray_ml_stages.model_card import ModelCard

APP_IMPORT_PATH = "airflow_ray_ml_stages.serve:build_app"
DEPLOYMENT_NAME = "ModelServer"
MAX_INSTANCES = 1024
BATCH_SIZE = 32
BATCH_WAIT_S = 0.0  # no added wait for a lone request; batches form from the queue under load


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass
class LoadedModel:
    """A model directory made ready to predict from raw feature rows."""

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

    def schema(self) -> dict[str, Any]:
        return {
            "input_columns": self.input_columns,
            "numeric": list(self.preprocessor.numeric_columns),
            "categorical": {column: list(values) for column, values in self.preprocessor.categories.items()},
            "max_instances": MAX_INSTANCES,
        }

    def metadata(self) -> dict[str, Any]:
        keys = ("model_version", "family", "metrics", "trained_at", "label_column", "data_fingerprint", "config")
        return {**{key: getattr(self.card, key) for key in keys}, "schema": self.schema()}

    def validate(self, instances: list[Any]) -> tuple[pd.DataFrame | None, list[dict[str, Any]]]:
        """Check raw rows against the schema; return the frame or the field-level errors."""
        numeric = self.preprocessor.numeric_columns
        categories = self.preprocessor.categories
        columns = self.input_columns
        errors: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        for index, instance in enumerate(instances):
            where = ["body", "instances", index]
            if isinstance(instance, list):
                if len(instance) != len(columns):
                    errors.append({"loc": where, "msg": f"a row given as a list needs {len(columns)} values in "
                                   f"the order {columns}, got {len(instance)}"})
                    continue
                instance = dict(zip(columns, instance))
            unknown = sorted(set(instance) - set(columns))
            missing = [column for column in columns if column not in instance]
            for column in unknown:
                errors.append({"loc": [*where, column], "msg": f"unknown feature; expected {columns}"})
            for column in missing:
                errors.append({"loc": [*where, column], "msg": "missing feature"})
            for column in numeric:
                value = instance.get(column)
                if column in instance and (isinstance(value, bool) or not isinstance(value, (int, float))
                                           or not math.isfinite(value)):
                    errors.append({"loc": [*where, column], "msg": f"must be a finite number, got {value!r}"})
            for column, allowed in categories.items():
                value = instance.get(column)
                if column in instance and value not in allowed:
                    errors.append({"loc": [*where, column], "msg": f"must be one of {allowed}, got {value!r}"})
            rows.append(instance)
        if errors:
            return None, errors
        return pd.DataFrame(rows, columns=columns), []

    def predict_frame(self, frame: pd.DataFrame) -> np.ndarray:
        """One value per row (regression), or rows x classes probabilities (classification)."""
        features = self.preprocessor.transform(frame)[self.card.feature_columns]
        predicted = np.asarray(self.model.predict(features.to_numpy(dtype="float32")), dtype="float64")
        return predicted if self.card.task == "classification" else predicted.reshape(-1)


def build_app(args: dict[str, Any]):
    """Serve application builder: ``args`` may carry ``api_key_sha256``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field
    from ray import serve

    api = FastAPI(title="airflow_ray_ml_stages model server")

    class PredictRequest(BaseModel):
        instances: list[dict[str, Any] | list[Any]] = Field(min_length=1, max_length=MAX_INSTANCES)

    @serve.deployment(name=DEPLOYMENT_NAME)
    @serve.ingress(api)
    class ModelServer:
        def __init__(self, api_key_sha256: str | None = None) -> None:
            self._api_key_sha256 = api_key_sha256 or None
            self._model: LoadedModel | None = None

        def reconfigure(self, config: dict[str, Any]) -> None:
            """Load the model named by ``user_config``; a broken artifact fails the deployment."""
            model = LoadedModel.load(config["model_dir"])
            expected = str(config.get("model_version") or "")
            if expected and model.version != expected:
                raise ValueError(f"model in {config['model_dir']} is version {model.version!r}, "
                                 f"the config says {expected!r}")
            self._model = model  # one assignment: requests see the old model or the new, never half

        def _denied(self, request: Request) -> JSONResponse | None:
            if not self._api_key_sha256:
                return None
            given = request.headers.get("x-api-key") or ""
            if not given and request.headers.get("authorization", "").lower().startswith("bearer "):
                given = request.headers["authorization"][7:]
            if given and hmac.compare_digest(hash_api_key(given), self._api_key_sha256):
                return None
            return JSONResponse({"detail": "missing or wrong API key: send it in the X-API-Key header"},
                                status_code=401)

        def _loaded(self) -> LoadedModel | JSONResponse:
            if self._model is None:
                return JSONResponse({"detail": "no model loaded yet"}, status_code=503)
            return self._model

        @api.get("/health")
        async def health(self, request: Request):
            if (denied := self._denied(request)) is not None:
                return denied
            model = self._loaded()
            if isinstance(model, JSONResponse):
                return model
            return {"status": "ok", "model_version": model.version}

        @api.get("/metadata")
        async def metadata(self, request: Request):
            if (denied := self._denied(request)) is not None:
                return denied
            model = self._loaded()
            return model if isinstance(model, JSONResponse) else model.metadata()

        @api.post("/predict")
        async def predict(self, body: PredictRequest, request: Request):
            if (denied := self._denied(request)) is not None:
                return denied
            model = self._loaded()
            if isinstance(model, JSONResponse):
                return model
            frame, errors = model.validate(body.instances)
            if errors:
                return JSONResponse({"detail": errors}, status_code=422)
            predictions = await self._predict_batched((model, frame))
            return {"predictions": predictions.tolist(), "model_version": model.version}

        @serve.batch(max_batch_size=BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
        async def _predict_batched(self, requests: list[tuple[LoadedModel, pd.DataFrame]]) -> list[np.ndarray]:
            # Requests of one batch may straddle a reconfigure: group them by the model they saw.
            results: list[np.ndarray | None] = [None] * len(requests)
            for model in {id(model): model for model, _ in requests}.values():
                members = [i for i, (m, _) in enumerate(requests) if m is model]
                frames = [requests[i][1] for i in members]
                predictions = model.predict_frame(pd.concat(frames, ignore_index=True))
                bounds = np.cumsum([0, *(len(frame) for frame in frames)])
                for position, index in enumerate(members):
                    results[index] = predictions[bounds[position]:bounds[position + 1]]
            return results

    return ModelServer.bind(api_key_sha256=args.get("api_key_sha256"))
