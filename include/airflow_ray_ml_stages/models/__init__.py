"""Model definitions and the loader the Serve stage (or anyone) uses outside Ray.

A model directory (written by the ``train`` stage) holds ``model_card.json``
(:class:`~airflow_ray_ml_stages.model_card.ModelCard`), the preprocessor JSON
when there is one, and the model in a format that loads without pickle:

- ``lightning``: ``model.pt`` (a state_dict of tensors, loaded with ``weights_only=True``) and
  ``model_config.json`` (n_features, hidden sizes, dropout, label offset and scale);
- ``xgboost``: ``model.ubj``, XGBoost's own format;
- ``extra_trees``, ``random_forest``: ``forest.npz``, the trees as plain arrays
  (:mod:`airflow_ray_ml_stages.models.forest`), applied with numpy;
- ``linear``: ``linear.npz``, the coefficients (:mod:`airflow_ray_ml_stages.models.linear`);
- ``ensemble``: ``members/<i>/``, each a model directory of the above, averaged with the weights
  the card lists (:mod:`airflow_ray_ml_stages.ensemble`).

``load_model(model_dir)`` returns an object with ``.predict(features) -> np.ndarray`` (features
already preprocessed, columns in the card's ``feature_columns`` order) and ``.card``. For a
regression model the predictions are one value per row; for a classification model, each row's
probability of every class (rows x classes, in the order of ``card.classes``; rows sum to 1).
torch and xgboost are imported only when a model of that family is loaded; scikit-learn never.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.preprocessor import feature_fill, fill_missing
from airflow_ray_ml_stages.train.config import ENSEMBLE, FORESTS

PREPROCESSOR = "preprocessor.json"
TORCH_WEIGHTS = "model.pt"
TORCH_CONFIG = "model_config.json"
XGBOOST_MODEL = "model.ubj"
MEMBERS_DIR = "members"
_XGBOOST_REFUSED = {"[": "%5B", "]": "%5D", "<": "%3C"}


def xgboost_feature_names(columns: list[str]) -> list[str]:
    """The feature columns as XGBoost takes them: it refuses names with ``[``, ``]`` or ``<`` (a
    one-hot column of a category such as ``1. <=Good``), so those characters are percent-encoded.
    Other names are unchanged, so boosters saved before read the same names."""
    names = []
    for column in columns:
        for char, code in _XGBOOST_REFUSED.items():
            column = column.replace(char, code)
        names.append(column)
    return names


def _as_features(features: Any, n_features: int) -> np.ndarray:
    array = np.asarray(features, dtype=np.float32)
    if not array.flags.writeable:  # torch.from_numpy warns on read-only arrays (e.g. from Arrow)
        array = array.copy()
    if array.ndim == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or array.shape[1] != n_features:
        raise ValueError(f"expected features of shape (rows, {n_features}), got {array.shape}")
    return array


def class_probabilities(raw: np.ndarray, classes: int) -> np.ndarray:
    """Rows x classes probabilities from a model's raw output for ``classes`` classes.

    XGBoost's binary objective gives one probability per row (of the second class); its multiclass
    objective, and the MLP after softmax, give a row per sample already.
    """
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim == 1:
        return np.column_stack([1.0 - raw, raw])
    return raw.reshape(-1, classes)


class LightningModel:
    """A trained MLP rebuilt from its state_dict (CPU, eval mode)."""

    family = "lightning"

    def __init__(self, card: ModelCard, model_config: dict[str, Any], state_dict: dict,
                 fill: list[float] | None = None) -> None:
        import torch

        from airflow_ray_ml_stages.models.mlp import MLP

        self.card = card
        self.model_config = model_config
        self.module = MLP(model_config["n_features"], model_config["hidden_sizes"],
                          model_config["dropout"], model_config.get("label_offset", 0.0),
                          model_config.get("label_scale", 1.0))
        self.module.load_state_dict(state_dict)
        self.module.eval()
        self._torch = torch
        self.fill = fill  # a missing feature's value (see fill_missing)

    def predict(self, features: Any) -> np.ndarray:
        array = fill_missing(_as_features(features, self.model_config["n_features"]), self.fill)
        with self._torch.inference_mode():
            return self.module.predict(self._torch.from_numpy(array)).numpy().astype(np.float64)


class XGBoostModel:
    """A trained XGBoost booster."""

    family = "xgboost"

    def __init__(self, card: ModelCard, booster) -> None:
        self.card = card
        self.booster = booster

    def predict(self, features: Any) -> np.ndarray:
        import xgboost

        array = _as_features(features, len(self.card.feature_columns))
        matrix = xgboost.DMatrix(array, feature_names=xgboost_feature_names(self.card.feature_columns))
        predicted = self.booster.predict(matrix).astype(np.float64)
        if self.card.task == "classification":
            return class_probabilities(predicted, len(self.card.classes))
        return predicted


class ArrayModel:
    """A trained scikit-learn family read from plain arrays: a forest's trees
    (:class:`~airflow_ray_ml_stages.models.forest.ForestTrees`) or a linear model's coefficients
    (:class:`~airflow_ray_ml_stages.models.linear.LinearWeights`), each checking it fits the card's features."""

    def __init__(self, card: ModelCard, weights, fill: list[float] | None = None) -> None:
        self.card = card
        self.family = card.family
        self.weights = weights
        self.fill = fill  # a missing feature's value (see fill_missing)
        weights.check_features(len(card.feature_columns))

    def predict(self, features: Any) -> np.ndarray:
        predicted = self.weights.predict(fill_missing(_as_features(features, len(self.card.feature_columns)),
                                                      self.fill))
        return predicted if self.card.task == "classification" else predicted.reshape(-1)


def load_xgboost_booster(data: bytes):
    """A booster from XGBoost's own (UBJSON) bytes, without pickle."""
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(bytearray(data))
    return booster


def load_torch_state_dict(data: bytes) -> dict:
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def member_dir(index: int) -> str:
    """Where member ``index`` lies in an ensemble's directory (its card's ``dir``)."""
    return f"{MEMBERS_DIR}/{index}"


class EnsembleModel:
    """Trained models averaged with weights: each gets the features as its own preprocessor scales them."""

    family = ENSEMBLE

    def __init__(self, card: ModelCard, members: list[tuple[float, Any, tuple | None]]) -> None:
        self.card = card
        self.members = members  # (weight, model, (multiply, add) or None)

    def predict(self, features: Any) -> np.ndarray:
        from airflow_ray_ml_stages.preprocessor import apply_affine

        array = _as_features(features, len(self.card.feature_columns))
        total = None
        for weight, model, affine in self.members:
            predicted = weight * model.predict(array if affine is None else apply_affine(array, *affine))
            total = predicted if total is None else total + predicted
        return total


def _load_ensemble(model_dir: str, card: ModelCard) -> EnsembleModel:
    from airflow_ray_ml_stages.errors import ArtifactError
    from airflow_ray_ml_stages.preprocessor import Preprocessor, feature_affine

    members = card.config.get("members") if isinstance(card.config, dict) else None
    if not isinstance(members, list) or not members:
        raise ArtifactError(f"the ensemble card of {model_dir!r} lists no members")
    top = Preprocessor.load(artifacts.join(model_dir, PREPROCESSOR)) if card.preprocessor else None
    loaded = []
    for index, member in enumerate(members):
        directory = member.get("dir") if isinstance(member, dict) else None
        if directory != member_dir(index) or not isinstance(member.get("weight"), (int, float)):
            raise ArtifactError(f"the ensemble card of {model_dir!r} lists member {index} as {member!r}; expected "
                                f"dir {member_dir(index)!r} and a weight")
        member_path = artifacts.join(model_dir, directory)
        model = load_model(member_path)
        if model.family == ENSEMBLE or model.card.feature_columns != card.feature_columns:
            raise ArtifactError(f"ensemble member {member_path!r} is an ensemble or takes other features")
        affine = None
        if top is not None and model.card.preprocessor:
            own = Preprocessor.load(artifacts.join(member_path, PREPROCESSOR))
            if own.scaler != top.scaler:
                affine = feature_affine(top, own, list(card.feature_columns))
        loaded.append((float(member["weight"]), model, affine))
    return EnsembleModel(card, loaded)


def load_model(model_dir: str) -> LightningModel | XGBoostModel | ArrayModel | EnsembleModel:
    """Load a model directory (local path or ``s3://``/``gs://`` URI) written by the train stage."""
    card = ModelCard.read(model_dir)
    if card.family == ENSEMBLE:
        return _load_ensemble(model_dir, card)
    # a missing feature (NaN, nan_policy impute) is imputed as in training; XGBoost takes it as missing itself
    fill = feature_fill(artifacts.join(model_dir, PREPROCESSOR) if card.preprocessor else None,
                        list(card.feature_columns)) if card.family != "xgboost" else None
    if card.family == "linear":
        from airflow_ray_ml_stages.models.linear import LINEAR_MODEL, LinearWeights

        return ArrayModel(card, LinearWeights(artifacts.read_bytes(artifacts.join(model_dir, LINEAR_MODEL))), fill)
    if card.family in FORESTS:
        from airflow_ray_ml_stages.models.forest import FOREST_MODEL, ForestTrees

        return ArrayModel(card, ForestTrees(artifacts.read_bytes(artifacts.join(model_dir, FOREST_MODEL))), fill)
    if card.family == "lightning":
        config = artifacts.read_json(artifacts.join(model_dir, TORCH_CONFIG))
        state = load_torch_state_dict(artifacts.read_bytes(artifacts.join(model_dir, TORCH_WEIGHTS)))
        return LightningModel(card, config, state, fill)
    return XGBoostModel(card, load_xgboost_booster(artifacts.read_bytes(artifacts.join(model_dir, XGBOOST_MODEL))))
