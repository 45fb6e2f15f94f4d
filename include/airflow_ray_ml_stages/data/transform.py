"""Pass 2: a batch's kept rows as written, model inputs from the fitted preprocessor, the label and the split.

The label is written as read (int64 where every value is an integer), or for classification as each
row's class index into the classes (int64).
"""

from __future__ import annotations

import numpy as np

from airflow_ray_ml_stages.data.batch import Batch, BatchContext
from airflow_ray_ml_stages.data.labels import place_rows
from airflow_ray_ml_stages.data.split import SPLIT_COLUMN, SPLITS, bins_of_hashes
from airflow_ray_ml_stages.data.validation import clean_batch
from airflow_ray_ml_stages.preprocessor import Preprocessor


def transform_batch(batch: Batch, ctx: BatchContext, preprocessor: Preprocessor, label_integral: bool):
    """The rows of one batch as written (a pyarrow table): model inputs, the label and the split name."""
    import pyarrow as pa

    keep, _, _ = clean_batch(batch, ctx)
    numeric = batch.numeric[keep] if not keep.all() else batch.numeric
    codes = {column: batch.codes[column][keep] for column in ctx.categorical}
    if ctx.stratified:
        label, label_codes = batch.kept_label(keep)
        split, class_index = place_rows(label, label_codes, batch.label_values, bins_of_hashes(batch.hashes(keep, ctx)),
                                        ctx)
    else:
        split, class_index = batch.splits(keep, ctx), None
    columns = output_columns(numeric, codes, batch.values, ctx, preprocessor, label_integral, class_index)
    columns[SPLIT_COLUMN] = pa.DictionaryArray.from_arrays(pa.array(split, pa.int8()), pa.array(SPLITS)).cast(pa.string())
    return pa.table(columns)


def output_columns(numeric: np.ndarray, codes: dict[str, np.ndarray], values: dict[str, list], ctx: BatchContext,
                   preprocessor: Preprocessor, label_integral: bool,
                   class_index: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The written columns (model inputs, then the label) of rows given in canonical arrays.

    :param class_index: classification: each row's class index, written as the label.
    """
    matrix = preprocessor.transform_arrays(numeric[:, :-1], {column: (codes[column], values[column])
                                                             for column in ctx.categorical})
    columns = {name: matrix[:, index] for index, name in enumerate(preprocessor.output_columns)}
    if class_index is not None:
        columns[ctx.label] = class_index.astype("int64", copy=False)
        return columns
    label = numeric[:, -1]
    columns[ctx.label] = label.astype("int64") if label_integral else label
    return columns


def transform(frame: pd.DataFrame, uris: list[str], ctx: BatchContext, preprocessor: Preprocessor,
              label_integral: bool) -> pd.DataFrame:
    """:func:`transform_batch` for a pandas frame of the used columns in canonical types."""
    return transform_batch(Batch.from_frame(frame, uris, ctx), ctx, preprocessor, label_integral).to_pandas()
