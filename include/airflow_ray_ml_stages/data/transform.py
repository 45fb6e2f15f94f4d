"""Pass 2: a batch's kept rows as written, model inputs from the fitted preprocessor, the label and the split."""

from __future__ import annotations

import numpy as np

from airflow_ray_ml_stages.data.batch import Batch, BatchContext
from airflow_ray_ml_stages.data.split import SPLIT_COLUMN, SPLITS
from airflow_ray_ml_stages.data.validation import clean_batch
from airflow_ray_ml_stages.preprocessor import Preprocessor


def transform_batch(batch: Batch, ctx: BatchContext, preprocessor: Preprocessor, label_integral: bool):
    """The rows of one batch as written (a pyarrow table): model inputs, the label and the split name."""
    import pyarrow as pa

    keep, _, _ = clean_batch(batch, ctx)
    numeric = batch.numeric[keep] if not keep.all() else batch.numeric
    codes = {column: batch.codes[column][keep] for column in ctx.categorical}
    columns = output_columns(numeric, codes, batch.values, ctx, preprocessor, label_integral)
    split = batch.splits(keep, ctx)
    columns[SPLIT_COLUMN] = pa.DictionaryArray.from_arrays(pa.array(split, pa.int8()), pa.array(SPLITS)).cast(pa.string())
    return pa.table(columns)


def output_columns(numeric: np.ndarray, codes: dict[str, np.ndarray], values: dict[str, list], ctx: BatchContext,
                   preprocessor: Preprocessor, label_integral: bool) -> dict[str, np.ndarray]:
    """The written columns (model inputs, then the label) of rows given in canonical arrays."""
    matrix = preprocessor.transform_arrays(numeric[:, :-1], {column: (codes[column], values[column])
                                                             for column in ctx.categorical})
    columns = {name: matrix[:, index] for index, name in enumerate(preprocessor.output_columns)}
    label = numeric[:, -1]
    columns[ctx.label] = label.astype("int64") if label_integral else label
    return columns


def transform(frame: pd.DataFrame, uris: list[str], ctx: BatchContext, preprocessor: Preprocessor,
              label_integral: bool) -> pd.DataFrame:
    """:func:`transform_batch` for a pandas frame of the used columns in canonical types."""
    return transform_batch(Batch.from_frame(frame, uris, ctx), ctx, preprocessor, label_integral).to_pandas()
