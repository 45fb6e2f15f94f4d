"""Preprocessed train/validation/test splits of the generated wine data, for training tests and benches.

The preprocessing stage is built separately; this stands in for its output: the numeric features
plus a one-hot of ``type``, standardised with the training split's statistics, in Parquet.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from airflow_ray_ml_stages import wine


def write_splits(directory: str | Path, rows: int = 6497, seed: int = 7, fractions=(0.7, 0.15),
                 classification: bool = False, label_threshold: float | None = None) -> dict:
    """Write ``train/validation/test.parquet`` and ``preprocessor.json``; return the train spec fields.

    ``classification``: the grades are the classes (or, with ``label_threshold``, grade >= threshold
    is class 1), and the splits hold class indexes, as the preprocess stage writes them.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = wine.generate(rows=rows, seed=seed)
    frame["type_red"] = (frame[wine.TYPE_COLUMN] == "red").astype("float64")
    frame["type_white"] = (frame[wine.TYPE_COLUMN] == "white").astype("float64")
    frame = frame.drop(columns=[wine.TYPE_COLUMN])
    features = [*wine.FEATURES, "type_red", "type_white"]
    classes = None
    if classification:
        grades = frame[wine.LABEL].to_numpy()
        if label_threshold is not None:
            grades = (grades >= label_threshold).astype("int64")
        classes = sorted(int(value) for value in np.unique(grades))
        frame[wine.LABEL] = np.searchsorted(classes, grades).astype("int64")
    order = np.random.default_rng(seed).permutation(len(frame))
    n_train, n_validation = int(fractions[0] * len(frame)), int(fractions[1] * len(frame))
    parts = {"train": order[:n_train], "validation": order[n_train:n_train + n_validation],
             "test": order[n_train + n_validation:]}
    train = frame.iloc[parts["train"]]
    mean = train[list(wine.FEATURES)].mean()
    std = train[list(wine.FEATURES)].std(ddof=0).replace(0, 1.0)
    uris = {}
    for name, index in parts.items():
        part = frame.iloc[index].reset_index(drop=True)
        part[list(wine.FEATURES)] = (part[list(wine.FEATURES)] - mean) / std
        if not classification:
            part[wine.LABEL] = part[wine.LABEL].astype("float64")
        path = directory / f"{name}.parquet"
        part.to_parquet(path, index=False)
        uris[f"{name}_uri"] = str(path)
    preprocessor = directory / "preprocessor.json"
    preprocessor.write_text(json.dumps({"features": features, "mean": mean.to_dict(), "std": std.to_dict()}))
    return {**uris, "feature_columns": features, "label_column": wine.LABEL,
            "preprocessor_uri": str(preprocessor), "data_fingerprint": f"wine-{rows}-{seed}", "classes": classes}


def load_split(uri: str, features: list[str], label: str = wine.LABEL) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    frame = pd.read_parquet(uri)
    return frame[features].to_numpy(np.float32), frame[label].to_numpy(np.float64)


def write_preprocessed(directory: str | Path, rows: int = 3000, seed: int = 7, scaler: str = "standard",
                       fractions=(0.7, 0.15)) -> dict:
    """Splits as the preprocess stage writes them (its Preprocessor, its column names), plus every
    scaler's variant; return the preprocess manifest's fields (``split_uris``, ``preprocessor_variants``...)."""
    from airflow_ray_ml_stages.preprocessor import Moments, Preprocessor
    from airflow_ray_ml_stages.specs import SCALERS

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frame = wine.generate(rows=rows, seed=seed)
    order = np.random.default_rng(seed).permutation(len(frame))
    n_train, n_validation = int(fractions[0] * len(frame)), int(fractions[1] * len(frame))
    parts = {"train": order[:n_train], "validation": order[n_train:n_train + n_validation],
             "test": order[n_train + n_validation:]}
    numeric = list(wine.FEATURES)
    moments = Moments.of(frame.iloc[parts["train"]][numeric].to_numpy(dtype="float64"))
    categories = {wine.TYPE_COLUMN: ["red", "white"]}
    variants = {}
    for name in SCALERS:
        path = directory / "preprocessors" / f"{name}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(Preprocessor.fit(name, numeric, moments, categories, wine.LABEL).to_json())
        variants[name] = str(path)
    written = Preprocessor.fit(scaler, numeric, moments, categories, wine.LABEL)
    preprocessor_uri = directory / "preprocessor.json"
    preprocessor_uri.write_text(written.to_json())
    split_uris = {}
    for name, index in parts.items():
        part = frame.iloc[index].reset_index(drop=True)
        out = written.transform(part)
        out[wine.LABEL] = part[wine.LABEL].astype("float64").to_numpy()
        path = directory / f"{name}.parquet"
        out.to_parquet(path, index=False)
        split_uris[name] = str(path)
    return {"split_uris": split_uris, "preprocessor_uri": str(preprocessor_uri), "preprocessor_variants": variants,
            "feature_columns": written.output_columns, "label_column": wine.LABEL,
            "fingerprint": f"wine-{rows}-{seed}", "rows": {k: len(v) for k, v in parts.items()}}


def as_preprocess_xcom(fields: dict) -> dict:
    """``write_splits``' train-spec fields in the shape of a preprocess task's XCom (``data=`` of RayTrain)."""
    import pyarrow.parquet as pq

    splits = {"train": fields["train_uri"], "validation": fields["validation_uri"], "test": fields["test_uri"]}
    return {"split_uris": splits, "rows": {name: pq.ParquetFile(uri).metadata.num_rows for name, uri in splits.items()},
            "feature_columns": fields["feature_columns"], "label_column": fields["label_column"],
            "preprocessor_uri": fields["preprocessor_uri"], "fingerprint": fields["data_fingerprint"]}
