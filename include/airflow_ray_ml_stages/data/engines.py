"""The two engines that run the per-batch functions over the sources (:func:`choose_engine` picks one).

- ``direct``: pyarrow in the job's driver, batches processed on a thread per core; pass 1 keeps
  the canonical kept rows and their split (classification: their hash bin) in local Arrow IPC
  scratch files, so pass 2 neither parses the input again nor rehashes. No Ray Data start-up, no
  ``ray.init``.
- ``ray_data``: Ray Data tasks across the cluster (one fused read -> map -> write task per file),
  for inputs large enough that other nodes' CPUs pay for its start-up.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterable

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.data.batch import Batch, BatchContext, dictionary_codes, float_numpy, joined
from airflow_ray_ml_stages.data.deferred_pandas import import_pandas
from airflow_ray_ml_stages.data.labels import place_rows
from airflow_ray_ml_stages.data.profile import (merge_split_summaries, merge_summaries, split_summaries,
                                                summarise_and_split, summarise_batch)
from airflow_ray_ml_stages.data.schema import ColumnPlan
from airflow_ray_ml_stages.data.sources import SourceLayout, filesystem_of, reader_path
from airflow_ray_ml_stages.data.split import SPLIT_COLUMN, SPLITS
from airflow_ray_ml_stages.data.transform import output_columns, transform_batch
from airflow_ray_ml_stages.preprocessor import Preprocessor
from airflow_ray_ml_stages.specs import PreprocessSpec


BATCH_ROWS = 131_072  # rows per map_batches call: bounds each worker's intermediates (see airflow_ray_ml_stages.data.stage)
MAX_FILE_BLOCK_BYTES = 256 * 1024 * 1024  # input bytes per Ray Data block by default (see read_dataset)


# -- the direct engine: pyarrow in the job's driver ----------------------------------------------

CSV_BLOCK_BYTES = 1 << 20  # pyarrow's streaming CSV reader parses blocks of this size in parallel


def available_cores() -> int:
    """CPUs this process may run on: the direct engine's threads."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _csv_options(layout: SourceLayout, plan: ColumnPlan):
    """pyarrow's parse and convert options for one CSV source: the used columns, typed."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    used = [c for c in layout.columns if c in plan.used]
    # Boolean columns are read as text too: their words become 1/0 in Batch.from_arrow.
    text = {*plan.categorical, *plan.boolean, *([plan.label] if plan.label_text else [])}
    types = {c: (pa.dictionary(pa.int32(), pa.string()) if c in text else pa.float64()) for c in used}
    return (pacsv.ParseOptions(delimiter=layout.delimiter),
            pacsv.ConvertOptions(column_types=types, include_columns=used))


def iter_source_tables(layout: SourceLayout, plan: ColumnPlan, batch_rows: int = BATCH_ROWS):
    """Stream one source as pyarrow tables of ``batch_rows`` rows, the last one fewer (its used columns only).

    The tables are the file's rows ``[0, batch_rows)``, ``[batch_rows, 2 * batch_rows)``, ...: the
    batches Ray Data's ``map_batches`` gives a file read as one block, so the copies of a row that
    a batch numbers (:func:`~airflow_ray_ml_stages.data.split.separate_copies`) are the same in
    both engines. Nothing but the current batch is held: CSV is read with pyarrow's streaming
    reader (blocks parsed on all cores), Parquet one record batch at a time.
    """
    filesystem, inner = filesystem_of(layout.path)
    if layout.file_format == "parquet":
        import pyarrow.parquet as pq

        used = [c for c in layout.columns if c in plan.used]
        with filesystem.open_input_file(inner) as handle:
            yield from _exact_batches(pq.ParquetFile(handle).iter_batches(batch_size=batch_rows, columns=used),
                                      batch_rows)
        return
    import pyarrow.csv as pacsv

    parse, convert = _csv_options(layout, plan)
    with filesystem.open_input_stream(inner) as stream:
        reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(use_threads=True, block_size=CSV_BLOCK_BYTES),
                                parse_options=parse, convert_options=convert)
        yield from _exact_batches(reader, batch_rows)


def _exact_batches(record_batches, batch_rows: int):
    """Record batches of any sizes as tables of exactly ``batch_rows`` rows (the last one fewer)."""
    import pyarrow as pa

    pending, rows = [], 0
    for batch in record_batches:
        pending.append(batch)
        rows += batch.num_rows
        while rows >= batch_rows:
            table = pa.Table.from_batches(pending)
            yield table.slice(0, batch_rows)
            rest = table.slice(batch_rows)
            pending, rows = rest.to_batches(), rest.num_rows  # no batch where nothing is left
    if pending:  # the rest; an input without rows is one empty table, as it was read
        yield pa.Table.from_batches(pending)


def _in_order(function, items: Iterable, workers: int):
    """``function`` over ``items`` on ``workers`` threads, results in input order, few in flight.

    At most ``workers + 1`` items are taken ahead of the results consumed, so memory stays bounded
    whatever the input size (``Executor.map`` would take every item at once). numpy and pyarrow
    release the GIL in the heavy steps, so the threads use several cores.
    """
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rayml-data") as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


# The scratch column of where each kept row goes: its split index, or in classification (whose cut
# points are known only after pass 1) its hash bin.
PLACEMENT_COLUMN = "placement"
LABEL_TEXT_COLUMN = "label"


def _scratch_table(batch: Batch, keep: np.ndarray, placement: np.ndarray, ctx: BatchContext):
    """The kept rows of a batch as pass 2 needs them: canonical values and their placement."""
    import pyarrow as pa

    def dictionary(codes: np.ndarray, values: list):
        return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), pa.array(values, pa.string()))

    every = bool(keep.all())
    numeric = batch.numeric if every else batch.numeric[keep]
    columns = {f"n{index}": numeric[:, index] for index in range(numeric.shape[1])}
    for position, column in enumerate(ctx.categorical):
        columns[f"c{position}"] = dictionary(batch.codes[column] if every else batch.codes[column][keep],
                                             batch.values[column])
    if batch.label_codes is not None:
        columns[LABEL_TEXT_COLUMN] = dictionary(batch.kept_label(keep)[1], batch.label_values)
    columns[PLACEMENT_COLUMN] = placement
    return pa.table(columns)


def _from_scratch(table, ctx: BatchContext) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, list], np.ndarray,
                                                    np.ndarray | None]:
    """Canonical rows back from a scratch table, with each row's split and (classification) class index."""
    width = len(ctx.numeric) + 1
    numeric = np.empty((table.num_rows, width), dtype="float64", order="F")
    for index in range(width):
        numeric[:, index] = float_numpy(table[f"n{index}"])
    codes, values = {}, {}
    for position, column in enumerate(ctx.categorical):
        codes[column], values[column] = dictionary_codes(table[f"c{position}"])
    placement = joined([chunk.to_numpy() for chunk in table[PLACEMENT_COLUMN].chunks], "int16")
    if not ctx.stratified:
        return numeric, codes, values, placement, None
    label_codes, label_values = (dictionary_codes(table[LABEL_TEXT_COLUMN]) if ctx.label_text else (None, None))
    split, class_index = place_rows(numeric[:, -1], label_codes, label_values, placement, ctx)
    return numeric, codes, values, split, class_index


def _scratch_files(scratch: str) -> list[str]:
    return sorted(name for name in os.listdir(scratch) if name.startswith("batch-"))


def _read_scratch(scratch: str, name: str):
    import pyarrow as pa

    with pa.memory_map(os.path.join(scratch, name)) as source:
        return pa.ipc.open_file(source).read_all()


def profile_direct(layouts: list[SourceLayout], ctx: BatchContext, scratch: str, workers: int) -> dict[str, Any]:
    """Pass 1 in the driver: check and summarise every batch; keep the canonical rows in ``scratch``.

    The scratch files (Arrow IPC, one per batch, on the driver's local disk) spare pass 2 the CSV
    parse and the split hash; they are removed with the scratch directory whatever happens.
    """
    import pyarrow as pa

    plan = ctx.plan

    def tables():
        number = 0
        for layout in layouts:
            for table in iter_source_tables(layout, plan):
                yield number, layout.path, table
                number += 1

    def profile(item) -> dict[str, Any]:
        number, path, table = item
        batch = Batch.from_arrow(table, ctx, path=path)
        summary, keep, splits = summarise_and_split(batch, ctx)
        part = _scratch_table(batch, keep, splits, ctx)
        with pa.OSFile(os.path.join(scratch, f"batch-{number:08d}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, part.schema) as writer:
                writer.write_table(part)
        return summary

    return merge_summaries(_in_order(profile, tables(), workers), len(ctx.numeric) + 1, ctx.max_categories)


def summarise_splits_direct(scratch: str, ctx: BatchContext, workers: int) -> dict[str, dict[str, Any]]:
    """Classification's per-split summary in the driver, from pass 1's scratch files (kept for pass 2)."""
    def summarise(name: str) -> dict[str, dict[str, Any]]:
        numeric, codes, values, split, class_index = _from_scratch(_read_scratch(scratch, name), ctx)
        return split_summaries(numeric, codes, values, split, class_index, ctx)

    return merge_split_summaries(_in_order(summarise, _scratch_files(scratch), workers), len(ctx.numeric) + 1)


def write_direct(splits_dir: str, scratch: str, ctx: BatchContext, preprocessor: Preprocessor, label_integral: bool,
                 workers: int) -> None:
    """Pass 2 in the driver: transform the scratch batches and append them to one Parquet file per split.

    Each batch becomes one row group per split, so memory stays bounded by the batch size.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    filesystem, root = artifacts.resolve(splits_dir)
    files = _scratch_files(scratch)

    def transform_file(name: str) -> list:
        numeric, codes, values, split, class_index = _from_scratch(_read_scratch(scratch, name), ctx)
        os.remove(os.path.join(scratch, name))
        parts = []
        for index in range(len(SPLITS)):
            rows = np.flatnonzero(split == index)
            if len(rows):
                columns = output_columns(numeric[rows], {c: v[rows] for c, v in codes.items()}, values, ctx,
                                         preprocessor, label_integral, None if class_index is None else class_index[rows])
                parts.append((index, pa.table(columns)))
        return parts

    writers: dict[int, Any] = {}
    try:
        for parts in _in_order(transform_file, files, workers):
            for index, table in parts:
                if index not in writers:
                    folder = f"{root}/{SPLIT_COLUMN}={SPLITS[index]}"
                    filesystem.create_dir(folder, recursive=True)
                    writers[index] = pq.ParquetWriter(f"{folder}/part-00000.parquet", table.schema,
                                                      filesystem=filesystem)
                writers[index].write_table(table)
    finally:
        for writer in writers.values():
            writer.close()


def choose_engine(spec: PreprocessSpec, layouts: list[SourceLayout]) -> tuple[str, str]:
    """``direct`` or ``ray_data``, and why.

    The direct engine skips Ray Data's start-up (worker processes that import it, two executions:
    ~2.5 s on a 2-CPU machine, more than the whole work at 650 k rows) and uses every core of the
    driver's node; Ray Data pays off only where other nodes add CPUs.
    """
    if spec.engine != "auto":
        return spec.engine, f"engine={spec.engine!r} set in the spec"
    size = sum(layout.size for layout in layouts)
    if size <= spec.direct_max_bytes:
        return "direct", (f"{size:,} input bytes <= direct_max_bytes={spec.direct_max_bytes:,}: pyarrow in the "
                          f"job's driver on {available_cores()} core(s), no Ray Data start-up")
    connect_ray()
    import ray

    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    if nodes <= 1:
        return "direct", (f"{size:,} input bytes, but the cluster has one node: pyarrow in the job's driver on "
                          f"{available_cores()} core(s) does the same work without Ray Data's start-up")
    return "ray_data", f"{size:,} input bytes > direct_max_bytes and {nodes} nodes: Ray Data tasks across the cluster"


# -- Ray Data ------------------------------------------------------------------------------------

def connect_ray() -> None:
    """Connect to the job's Ray cluster for Ray Data, with pandas (Ray Data works in pandas)."""
    import_pandas()  # Ray Data works in pandas
    import ray

    if not ray.is_initialized():
        ray.init(logging_level=logging.WARNING, log_to_driver=False)  # RAY_ADDRESS in a job
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False


def read_dataset(layouts: list[SourceLayout], plan: ColumnPlan, spec: PreprocessSpec):
    """One Ray Dataset over every source, with only the used columns and a ``path`` column."""
    import ray.data

    groups: dict[tuple, list[str]] = {}
    sizes: dict[tuple, int] = {}
    for layout in layouts:
        key = (layout.file_format, layout.delimiter, tuple(layout.columns))
        groups.setdefault(key, []).append(layout.path)
        sizes[key] = sizes.get(key, 0) + layout.size
    datasets = []
    for (file_format, delimiter, columns), paths in groups.items():
        used = [c for c in columns if c in plan.used]
        # One block per file by default: Ray's default splits a file's output into many ~1 MiB
        # blocks (38 for a 40 MB CSV on 2 CPUs), which stops the read from fusing with the map and
        # pays a task per block; one fused read->map(->write) task per file is 2x faster (measured,
        # README "Preprocessing"). A fused write task holds its whole output until it writes, so
        # files larger than MAX_FILE_BLOCK_BYTES on average are split into more blocks (unfused).
        blocks = spec.override_num_blocks or max(len(paths), -(-sizes[(file_format, delimiter, columns)]
                                                                // MAX_FILE_BLOCK_BYTES))
        if file_format == "csv":
            layout = next(l for l in layouts if (l.file_format, l.delimiter, tuple(l.columns)) == (file_format, delimiter, columns))
            parse, convert = _csv_options(layout, plan)
            datasets.append(ray.data.read_csv(
                paths, include_paths=True, partitioning=None, override_num_blocks=blocks,
                parse_options=parse, convert_options=convert,
            ))
        else:
            datasets.append(ray.data.read_parquet(
                paths, columns=used, include_paths=True, partitioning=None,
                override_num_blocks=blocks,
            ))
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def summarise_ray_batch(batch, ctx: BatchContext) -> dict[str, list]:
    """Ray Data's pass 1 on one batch: its summary, as one JSON row."""
    return {"summary": [json.dumps(summarise_batch(Batch.from_arrow(batch, ctx), ctx))]}


def transform_ray_batch(batch, ctx: BatchContext, preprocessor: dict, label_integral: bool):
    """Ray Data's pass 2 on one batch: its rows as written."""
    return transform_batch(Batch.from_arrow(batch, ctx), ctx, Preprocessor.from_dict(preprocessor), label_integral)


def ray_uri(uri: str) -> str:
    """Where Ray Data writes ``uri``: a remote URI as it is, a local one as an absolute path."""
    return uri if artifacts.is_remote(uri) else reader_path(uri)
