"""The preprocessed splits as training reads them, and the map to the scaler a config asks for.

A split is read with ``pyarrow.parquet`` alone (:class:`ParquetSplit`), or as the Ray Data shard
Ray Train hands a worker (the training split only: the evaluation splits are small and unsharded, so
every worker reads them directly); :func:`split_arrays` gives a loop either as float32 arrays, read
once and mapped to another scaler's scaling where :func:`scaler_plan` says so (an exact affine map
per feature). :func:`tensor_batches` then iterates them as whole-batch tensor slices.
"""

from __future__ import annotations

import os

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.errors import DataSourceError, SpecError
from airflow_ray_ml_stages.metrics import prior_probabilities
from airflow_ray_ml_stages.preprocessor import Preprocessor, apply_affine, feature_affine, fill_missing
from airflow_ray_ml_stages.train.loop_config import TrainLoopConfig

SPLITS = ("train", "validation", "test")


class ParquetSplit:
    """A split written as one Parquet file or a directory of them, read with ``pyarrow.parquet`` alone.

    (``pyarrow.dataset`` would do, but importing it imports pandas too: ~0.5 s of a wine-scale run.)
    Files are read in sorted path order, so a split reads the same way every time.
    """

    def __init__(self, uri: str, columns: list[str]) -> None:
        from pyarrow import fs as pafs

        self.uri = uri
        self.filesystem, path = artifacts.resolve(uri)
        try:
            info = self.filesystem.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"{path} does not exist")
            if info.type == pafs.FileType.Directory:
                found = self.filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
                self.files = sorted(entry.path for entry in found if entry.type == pafs.FileType.File
                                    and not os.path.basename(entry.path).startswith((".", "_")))
            else:
                self.files = [path]
            if not self.files:
                raise FileNotFoundError(f"{path} holds no Parquet file")
            names = self._file(self.files[0]).schema_arrow.names
        except (FileNotFoundError, OSError) as err:
            raise DataSourceError(f"cannot read the Parquet split {uri!r}: {err}") from err
        missing = sorted(set(columns) - set(names))
        if missing:
            raise DataSourceError(
                f"split {uri!r} lacks column(s) {missing}; it has {names}. "
                "Pass feature_columns/label_column that match the preprocessed data"
            )

    @property
    def num_rows(self) -> int:
        """Rows in every file, from the Parquet footers."""
        return sum(self._file(path).metadata.num_rows for path in self.files)

    def _file(self, path: str):
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.filesystem.open_input_file(path))

    def to_table(self, columns: list[str]):
        import pyarrow as pa

        return pa.concat_tables([self._file(path).read(columns=columns) for path in self.files])


def label_stats(uri: str, label: str, columns: list[str],
                classes: list | None = None) -> tuple[int, float, float, list[float] | None]:
    """Rows, label mean, label std and (classification) each class's share of a split, read with pyarrow alone (one column).

    :param classes: the classification's classes (the split holds indexes into them); None: regression.
    """
    table = ParquetSplit(uri, columns).to_table(columns=[label])
    if table.num_rows == 0:
        raise DataSourceError(f"split {uri!r} has no rows")
    values = np.asarray(table.column(label).to_numpy(zero_copy_only=False), dtype=np.float64)
    mean, std = float(np.mean(values)), float(np.std(values))
    if classes is None:
        return table.num_rows, mean, std, None
    if not np.all((values >= 0) & (values < len(classes)) & (values == np.floor(values))):
        raise DataSourceError(f"split {uri!r}: label {label!r} must hold class indexes 0..{len(classes) - 1} for the "
                              f"classes {classes!r:.200}; pass the preprocess manifest's splits and classes together")
    return table.num_rows, mean, std, prior_probabilities(values, len(classes)).tolist()


def shard_arrays(shard, features: list[str], label: str) -> tuple[np.ndarray, np.ndarray]:
    """Read a Ray Data shard (or dataset) once into float32 feature and label arrays."""
    xs, ys = [], []
    for batch in shard.iter_batches(batch_size=65536, batch_format="numpy"):
        xs.append(np.column_stack([np.asarray(batch[column], dtype=np.float32) for column in features]))
        ys.append(np.asarray(batch[label], dtype=np.float32))
    if not xs:
        return np.zeros((0, len(features)), np.float32), np.zeros(0, np.float32)
    return np.concatenate(xs), np.concatenate(ys)


def split_arrays(cfg: TrainLoopConfig, split: str, rank: int = 0, world_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A split as arrays: the training split from the Ray Dataset shard, or read directly and sliced by rank.

    The validation and test splits are always read directly, whole: with ``ray_data`` each would
    otherwise be one more streaming execution (read tasks in new worker processes) per worker for
    a few MB. A directly read training split is sliced by rank into equal parts (at most
    ``world_size - 1`` rows left out), as Ray Data's equal split does, so every rank runs as many
    steps as the others. With ``cfg.feature_fill`` missing values (NaN) are imputed, and with
    ``cfg.feature_affine`` (``[multiply, add]`` per feature, see
    :func:`airflow_ray_ml_stages.preprocessor.feature_affine`) the features are mapped to another scaler's scaling.
    """
    features, label = cfg.feature_columns, cfg.label_column
    if cfg.data_loading == "ray_data" and split == "train":
        x, y = shard_arrays(_train_shard(), features, label)
        return _map_features(cfg, x), y
    x, y = read_split(cfg.uris[split], features, label)
    x = _map_features(cfg, x)
    if split == "train" and world_size > 1:
        rows = len(x) // world_size
        return x[rank::world_size][:rows], y[rank::world_size][:rows]
    return x, y


def read_split(uri: str, features: list[str], label: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's features and label as float32 arrays, read directly (columns in ``features`` order)."""
    table = ParquetSplit(uri, [*features, label]).to_table(columns=[*features, label])
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in features])
    return x, table.column(label).to_numpy(zero_copy_only=False).astype(np.float32)


def _train_shard():
    import ray.data
    import ray.train

    ray.data.DataContext.get_current().enable_progress_bars = False
    return ray.train.get_dataset_shard("train")


def start_reading_train_split(cfg: TrainLoopConfig, rank: int = 0, world_size: int = 1):
    """Start reading this rank's training arrays in a thread; call the result for ``(x, y)``.

    A Ray Train worker starts a Ray Data read of its shard (a coordinator actor, read tasks in
    worker processes of their own: seconds of start-up) and imports torch and Lightning (seconds of
    CPU): started first, the read overlaps the imports instead of following them. The shard is
    taken here, in the training thread, since Ray Train's context belongs to it.
    """
    from concurrent.futures import ThreadPoolExecutor

    shard = _train_shard() if cfg.data_loading == "ray_data" else None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-train-split")
    if shard is None:
        future = pool.submit(split_arrays, cfg, "train", rank, world_size)
    else:
        future = pool.submit(lambda: (lambda x, y: (_map_features(cfg, x), y))(
            *shard_arrays(shard, cfg.feature_columns, cfg.label_column)))
    pool.shutdown(wait=False)
    return future.result


class _TensorRows:
    """Rows of feature and label tensors that a DataLoader fetches a whole batch at a time."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]):
        import torch

        index = torch.as_tensor(indices)
        return self.x[index], self.y[index]


def _whole_batch(batch):
    return batch


def tensor_batches(x: np.ndarray, y: np.ndarray, batch_size: int, *, shuffle: bool = False, generator=None):
    """A DataLoader over ``(x, y)`` that yields the batches ``DataLoader(TensorDataset(x, y), ...)`` would.

    The same sampler (``shuffle`` draws from ``generator`` as the plain DataLoader does), so the
    same rows in the same batches and the same loss, but each batch is one index into the two
    tensors instead of a tensor per row and a stack: per-row fetching and collation took about half
    of a Lightning epoch's time on wine-like rows.
    """
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(_TensorRows(torch.from_numpy(x), torch.from_numpy(y)), batch_size=batch_size,
                      shuffle=shuffle, generator=generator, collate_fn=_whole_batch)


def _map_features(cfg: TrainLoopConfig, x: np.ndarray) -> np.ndarray:
    x = fill_missing(x, cfg.feature_fill)
    affine = cfg.feature_affine
    if not affine:
        return x
    return apply_affine(x, *affine)


def scaler_plan(preprocessor_uri: str | None, variants: dict[str, str] | None, scaler: str | None,
                feature_columns: list[str]) -> tuple[list[list[float]] | None, str | None]:
    """How to give a model features scaled by ``scaler``: ``(feature_affine or None, preprocessor URI)``.

    The splits are written with ``preprocessor_uri``'s scaler. Asking for that one (or for none)
    changes nothing; asking for another maps the features with the preprocess manifest's variant
    of it (fitted on the same training statistics), and that variant is the model's preprocessor.
    """
    if scaler is None:
        return None, preprocessor_uri
    if preprocessor_uri is None:
        raise SpecError(f"scaler {scaler!r} asked for, but no preprocessor_uri says how the splits were scaled")
    written = Preprocessor.load(preprocessor_uri)
    if scaler == written.scaler:
        return None, preprocessor_uri
    uri = (variants or {}).get(scaler)
    if uri is None:
        raise SpecError(
            f"the config asks for scaler {scaler!r}, but the splits were written with {written.scaler!r} and the "
            f"preprocess manifest lists no {scaler!r} variant (preprocessor_variants: {sorted(variants or {})}); "
            f"rerun the preprocess stage (it writes every scaler's variant) or ask for scaler {written.scaler!r}"
        )
    multiply, add = feature_affine(written, Preprocessor.load(uri), list(feature_columns))
    return [multiply.tolist(), add.tolist()], uri
