"""Stage ``score``: batch predictions for a file of new rows with a trained model, on Ray Data.

Run as ``python -m airflow_ray_ml_stages.score --spec '<json>'`` (a Ray job). The stage reads the input (CSV in
either delimiter, or Parquet; one file or a directory of them), scores it in batches with a model
loaded once, and writes the input rows plus a prediction column next to the input, in the input's
format. Two engines do it alike (``engine``): ``ray_data`` reads the input as a Ray Dataset and
scores it with ``map_batches`` on a pool of actors that each load the model directory once (Ray
Data's batch-inference pattern: the model is never shipped with every batch); ``direct`` scores
each file in the job's driver, which skips Ray Data's start-up (seconds, more than a small file's
whole work). ``auto`` picks by the input's size. A classification model's
prediction is the class, and each class's probability gets a column of its own
(``probability_<class>``).

Nothing is overwritten: the output goes to ``<input name>.predictions-<model version>`` (with
``-2``, ``-3``... when that exists). On a local filesystem the files are written to a hidden
temporary directory and renamed into place only when every batch succeeded, so a failed run leaves
no partial output behind.

Then the file is compared with the model's training data, column by column (:mod:`airflow_ray_ml_stages.drift`):
the report is written beside the predictions as ``<output>.drift.json`` and is the manifest's ``drift``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import uuid
from typing import Any

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import is_missing
from airflow_ray_ml_stages.drift import DriftCounter, drift_report
from airflow_ray_ml_stages.errors import DataSourceError, SpecError, quotable
from airflow_ray_ml_stages.model_card import ModelCard
from airflow_ray_ml_stages.preprocessor import boolean_numbers
from airflow_ray_ml_stages.specs import ScoreResult, ScoreSpec
from airflow_ray_ml_stages.stage import main_of, run_stage
from airflow_ray_ml_stages.tables import PARQUET_SUFFIXES, colour_from_name, detect_delimiter
from airflow_ray_ml_stages.wine import TYPE_COLUMN

log = logging.getLogger("airflow_ray_ml_stages.score")

IO_TASK_CPUS = 0.25
"""CPUs each read and write task of the scoring reserves. Ray Data's default is 1, so on a small cluster
where Serve replicas already hold a share (three replicas of 0.25 on 2 CPUs, beside a scoring actor of
0.5) no read task could start and the job waited forever; a quarter CPU always fits beside them."""

PATH_COLUMN = "__rayml_source_path"
SAMPLE_ROWS = 3
_ERROR_MARK = "rayml-score-error: "
PROBABILITY_PREFIX = "probability_"


def _input_files(uri: str) -> tuple[list[str], int]:
    """The data files named by ``uri`` (the file itself, or the CSV/Parquet files of a directory),
    and their size in bytes together."""
    from pyarrow import fs as pafs

    if uri.startswith(("http://", "https://")):
        raise DataSourceError(f"cannot score {uri!r}: batch scoring reads local paths, s3:// or gs://; "
                              "copy the file there first")
    filesystem, path = artifacts.resolve(uri)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise DataSourceError(f"the file to score {uri!r} does not exist")
    if info.type == pafs.FileType.File:
        return [uri], info.size or 0
    selector = pafs.FileSelector(path, recursive=False)
    entries = sorted((entry for entry in filesystem.get_file_info(selector)
                      if entry.type == pafs.FileType.File and not entry.base_name.startswith((".", "_"))),
                     key=lambda entry: entry.base_name)
    if not entries:
        raise DataSourceError(f"the directory to score {uri!r} holds no data files")
    return [artifacts.join(uri, entry.base_name) for entry in entries], sum(entry.size or 0 for entry in entries)


def _format_of(files: list[str]) -> str:
    kinds = {"parquet" if f.lower().endswith(PARQUET_SUFFIXES) else "csv" for f in files}
    if len(kinds) > 1:
        raise DataSourceError(f"the input mixes CSV and Parquet files ({files[:4]}...): score one format at a time")
    return kinds.pop()


def _head(uri: str, size: int = 65536) -> str:
    filesystem, path = artifacts.resolve(uri)
    with filesystem.open_input_stream(path) as stream:
        return stream.read(size).decode("utf-8-sig", errors="replace")


def default_output(input_uri: str, model_version: str) -> str:
    """``<input without its suffix>.predictions-<version>``, beside the input; never an existing one."""
    trimmed = input_uri.rstrip("/")
    parent, name = trimmed.rsplit("/", 1) if "/" in trimmed else ("", trimmed)
    stem = re.sub(r"\.(csv|txt|parquet|pq)$", "", name, flags=re.IGNORECASE)
    base = f"{stem}.predictions-{artifacts.safe_segment(model_version)}"
    candidate, counter = base, 1
    while artifacts.exists(artifacts.join(parent, candidate) if parent else candidate):
        counter += 1
        candidate = f"{base}-{counter}"
    return artifacts.join(parent, candidate) if parent else candidate


def choose_engine(spec: ScoreSpec, size: int) -> tuple[str, str]:
    """``direct`` or ``ray_data`` for an input of ``size`` bytes, and why."""
    if spec.engine != "auto":
        return spec.engine, f"engine={spec.engine!r} set in the spec"
    if size <= spec.direct_max_bytes:
        return "direct", (f"{size:,} input bytes <= direct_max_bytes={spec.direct_max_bytes:,}: the model scores "
                          "in the job's driver, no Ray Data start-up")
    return "ray_data", (f"{size:,} input bytes > direct_max_bytes={spec.direct_max_bytes:,}: {spec.concurrency} "
                        "Ray Data actor(s)")


class BatchScorer:
    """Loads the model directory once, then scores pandas batches: a Ray Data actor (engine
    ``ray_data``) or an object in the job's driver (``direct``)."""

    def __init__(self, model_dir: str, prediction_column: str, colour_by_path: bool, missing_values: str,
                 unseen_categories: str) -> None:
        from airflow_ray_ml_stages.serve import LoadedModel

        self.model = LoadedModel.load(model_dir)
        self.prediction_column = prediction_column
        self.colour_by_path = colour_by_path
        self.missing_values = missing_values  # impute, drop or fail (see missing_values_of)
        self.unseen_categories = unseen_categories  # missing or fail

    def _fail(self, message: str) -> None:
        raise DataSourceError(_ERROR_MARK + message)

    def __call__(self, batch):
        import pandas as pd

        if self.colour_by_path:
            paths = batch.pop(PATH_COLUMN)
            colours = paths.map(colour_from_name)
            if colours.isna().any():
                self._fail(f"rows of {paths[colours.isna()].iloc[0]!r} have no {TYPE_COLUMN!r} column and its "
                           "name says neither red nor white; add the column")
            batch.insert(0, TYPE_COLUMN, colours)
        columns = self.model.input_columns
        frame = batch.loc[:, columns].copy()
        missing = np.zeros(len(frame), dtype=bool)  # rows with a missing value
        fix = ("fix or drop those rows" if self.missing_values == "fail" else
               "fix them")
        for column in self.model.preprocessor.numeric_columns:
            values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
            absent = _absent(frame[column]) | np.isinf(values)
            bad = np.isnan(values) & ~absent
            if self.missing_values == "fail":
                bad |= absent
            if bad.any():
                sample = quotable(batch.loc[bad, columns].head(SAMPLE_ROWS).to_dict(orient="records"))
                what = "non-numeric, missing or infinite" if self.missing_values == "fail" else "non-numeric"
                self._fail(f"column {column!r} has {int(bad.sum())} {what} value(s) in this batch, e.g. rows "
                           f"{sample}; {fix}")
            missing |= absent
            frame[column] = np.where(absent, np.nan, values)
        for column in self.model.preprocessor.boolean_columns:
            numbers, _ = boolean_numbers(frame[column].to_numpy(dtype=object))
            absent = _absent(frame[column])
            bad = np.isnan(numbers) & (~absent | (self.missing_values == "fail"))
            if bad.any():
                sample = batch.loc[bad, columns].head(SAMPLE_ROWS).to_dict(orient="records")
                self._fail(f"column {column!r} holds booleans but has {int(bad.sum())} "
                           f"{'missing or other' if self.missing_values == 'fail' else 'other'} value(s) in this "
                           f"batch, e.g. rows {sample}; give true/false (or yes/no) in every row")
            missing |= absent
            frame[column] = np.where(absent, None, numbers.astype(bool))
        for column, allowed in self.model.preprocessor.categories.items():
            absent = _absent(frame[column])
            unseen = ~frame[column].isin(allowed) & ~absent
            bad = unseen | absent if self.missing_values == "fail" else (
                unseen if self.unseen_categories == "fail" else np.zeros(len(frame), dtype=bool))
            if bad.any():
                seen = quotable(sorted({str(v) for v in frame.loc[bad, column].head(20)}))
                self._fail(f"column {column!r} has value(s) {seen} the model was not trained on; allowed: {allowed}")
            absent = absent | unseen  # scored as missing (unseen_categories='missing'), as the drift report counts it
            missing |= absent
            frame[column] = frame[column].where(~absent, None)
        out = batch.copy()
        if self.missing_values == "drop" and missing.any():
            frame, out = frame[~missing], out[~missing]
            if frame.empty:
                return out.assign(**{name: pd.Series(dtype="float64") for name in self._added()})
        predicted = self.model.predict_frame(frame)
        classes = self.model.card.classes
        if classes is None:
            out[self.prediction_column] = predicted
            return out
        out[self.prediction_column] = np.asarray(classes)[predicted.argmax(axis=1)]
        for index, column in enumerate(probability_columns(classes)):
            out[column] = predicted[:, index]
        return out

    def _added(self) -> list[str]:
        classes = self.model.card.classes
        return [self.prediction_column, *(probability_columns(classes) if classes is not None else [])]


def _absent(values) -> np.ndarray:
    """Where a column of raw values misses one (:func:`~airflow_ray_ml_stages.constants.is_missing`)."""
    return np.array([is_missing(value) for value in values.to_numpy(dtype=object)], dtype=bool)


def missing_values_of(asked: str, fill: dict) -> str:
    """What missing values get (``impute``, ``drop`` or ``fail``) for the spec's setting and the model's
    imputation (its preprocessor's ``fill``); SpecError where ``impute`` is asked of a model that cannot."""
    if asked == "model":
        return "impute" if fill else "drop"
    if asked == "impute" and not fill:
        raise SpecError("missing_values='impute', but the model was trained without imputing (its preprocessor "
                        "has no fill values: nan_policy was not 'impute'); use 'drop' or 'fail', or retrain "
                        "with nan_policy='impute'")
    return asked


def probability_columns(classes: list) -> list[str]:
    """The column of each class's probability in a classification model's scores."""
    return [f"{PROBABILITY_PREFIX}{value}" for value in classes]


def _user_error(err: Exception) -> str | None:
    """Our own message out of a Ray task/actor error that wraps it (None if it is not ours)."""
    text = str(err)
    if _ERROR_MARK not in text:
        return None
    return text.split(_ERROR_MARK, 1)[1].splitlines()[0].strip()


def _score_direct(files: list[str], output_format: str, delimiter: str | None, scorer: BatchScorer,
                  target: str, batch_size: int) -> int:
    """Score each file in this process into a file of its own under ``target``: the rows read as
    Ray Data's readers read them (pyarrow, the whole file), the model called ``batch_size`` rows at a
    time, the output written as Ray Data writes it."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rows_read = 0
    for index, uri in enumerate(files):
        filesystem, path = artifacts.resolve(uri)
        if output_format == "parquet":
            with filesystem.open_input_file(path) as handle:
                table = pq.read_table(handle)
        else:
            with filesystem.open_input_stream(path) as stream:
                table = pacsv.read_csv(stream, parse_options=pacsv.ParseOptions(delimiter=delimiter))
        rows_read += table.num_rows
        if not table.num_rows:
            continue
        batches = []
        for offset in range(0, table.num_rows, batch_size):
            batch = table.slice(offset, batch_size).to_pandas()
            if scorer.colour_by_path:
                batch[PATH_COLUMN] = path
            batches.append(scorer(batch))
        scored = pa.Table.from_pandas(pd.concat(batches, ignore_index=True), preserve_index=False)
        sink = pa.BufferOutputStream()
        if output_format == "parquet":
            pq.write_table(scored, sink)
        else:
            pacsv.write_csv(scored, sink)
        artifacts.write_bytes_atomic(artifacts.join(target, f"part-{index:05d}.{output_format}"),
                                     sink.getvalue().to_pybytes())
    return rows_read


def _score_on_ray_data(files: list[str], output_format: str, delimiter: str | None, colour_by_path: bool,
                       spec: ScoreSpec, prediction_column: str, target: str, missing_values: str) -> int | None:
    """Score on Ray Data actors; the rows read where ``drop`` may leave some out (else None: as many as written)."""
    import pyarrow.csv as pacsv
    import ray
    import ray.data

    ray.init(address="auto", logging_level=logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True  # predictions in the input's row order
    filesystem, _ = artifacts.resolve(files[0])
    paths = [artifacts.resolve(f)[1] for f in files]
    io_args = {"num_cpus": IO_TASK_CPUS}
    if output_format == "parquet":
        dataset = ray.data.read_parquet(paths, filesystem=filesystem, include_paths=colour_by_path,
                                        ray_remote_args=io_args)
    else:
        dataset = ray.data.read_csv(
            paths, filesystem=filesystem, include_paths=colour_by_path,
            parse_options=pacsv.ParseOptions(delimiter=delimiter), ray_remote_args=io_args,
        )
    if colour_by_path:
        dataset = dataset.rename_columns({"path": PATH_COLUMN})
    rows_read = dataset.count() if missing_values == "drop" else None
    scored = dataset.map_batches(
        BatchScorer, fn_constructor_args=(spec.model_dir, prediction_column, colour_by_path, missing_values,
                                          spec.unseen_categories),
        batch_format="pandas", batch_size=spec.batch_size, concurrency=spec.concurrency,
        num_cpus=spec.cpus_per_actor,
    )
    if output_format == "parquet":
        scored.write_parquet(target, ray_remote_args=io_args)
    else:
        scored.write_csv(target, ray_remote_args=io_args)
    return rows_read


def _summary(output_uri: str, output_format: str, column: str, classification: bool) -> tuple[int, dict[str, float]]:
    """Rows and the predictions' mean, min and max (regression) or count per class (classification)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    filesystem, path = artifacts.resolve(output_uri)
    dataset = pads.dataset(path, filesystem=filesystem, format=output_format)
    values = dataset.to_table(columns=[column]).column(column)
    if len(values) == 0:
        return 0, {}
    if classification:
        counts = pc.value_counts(values).to_pylist()
        return len(values), {str(item["values"]): int(item["counts"]) for item in counts}
    stats = pc.min_max(values)
    return len(values), {"mean": float(pc.mean(values).as_py()), "min": float(stats["min"].as_py()),
                         "max": float(stats["max"].as_py())}


def _columns(files: list[str], output_format: str) -> tuple[list[str], str | None]:
    """The first file's column names, read without Ray (a Parquet footer or a CSV header), and the
    CSV's delimiter."""
    if output_format == "parquet":
        import pyarrow.parquet as pq

        filesystem, path = artifacts.resolve(files[0])
        with filesystem.open_input_file(path) as handle:
            return list(pq.ParquetFile(handle).schema_arrow.names), None
    head = _head(files[0])
    header = head.splitlines()[0] if head.strip() else ""
    if not header:
        raise DataSourceError(f"{files[0]!r} is empty: give a file with a header row and data rows")
    delimiter = detect_delimiter(header)
    return [name.strip().strip('"') for name in header.split(delimiter)], delimiter


def run_scoring(spec: ScoreSpec) -> ScoreResult:
    """Score ``spec.input_uri`` with the model; everything a file or a model can get wrong is checked
    before the job connects to Ray (only a value the model cannot read is found while scoring)."""
    from airflow_ray_ml_stages.preprocessor import Preprocessor

    card = ModelCard.read(spec.model_dir)
    version = card.model_version or "unknown"
    prediction_column = spec.prediction_column or f"predicted_{card.label_column}"
    files, size = _input_files(spec.input_uri)
    output_format = _format_of(files)
    names, delimiter = _columns(files, output_format)
    preprocessor = Preprocessor.load(artifacts.join(spec.model_dir, "preprocessor.json"))
    missing_values = missing_values_of(spec.missing_values, preprocessor.fill)
    needed = list(preprocessor.input_columns)
    colour_by_path = (TYPE_COLUMN in needed and TYPE_COLUMN not in names
                      and all(colour_from_name(f) for f in files))
    missing = [c for c in needed if c not in names and not (c == TYPE_COLUMN and colour_by_path)]
    if missing:
        raise DataSourceError(f"{files[0]!r} lacks column(s) {missing} that model {version} needs; "
                              f"it has {names}; the model takes {needed}")
    added = [prediction_column, *(probability_columns(card.classes) if card.classes is not None else [])]
    taken = [column for column in added if column in names]
    if taken:
        raise DataSourceError(f"{files[0]!r} already has column(s) {taken} that scoring adds; "
                              "pass another prediction_column, or rename them")
    output_uri = spec.output_uri or default_output(spec.input_uri, version)
    if spec.output_uri and artifacts.exists(output_uri):
        raise DataSourceError(f"output_uri {output_uri!r} exists; predictions never overwrite earlier ones: "
                              "choose another output_uri or leave it empty")

    engine, why = choose_engine(spec, size)
    log.info("engine %s: %s", engine, why)
    local = not artifacts.is_remote(output_uri)
    target = output_uri
    if local:  # write into a hidden sibling, rename into place once everything succeeded
        final_path = artifacts.resolve(output_uri)[1]
        target = os.path.join(os.path.dirname(final_path), f".{os.path.basename(final_path)}.tmp-{uuid.uuid4().hex[:8]}")
    log.info("scoring %s (%d file(s), %s) with model %s into %s", spec.input_uri, len(files), output_format,
             version, output_uri)
    try:
        if engine == "direct":
            if local:
                os.makedirs(target)
            scorer = BatchScorer(spec.model_dir, prediction_column, colour_by_path, missing_values,
                                 spec.unseen_categories)
            rows_read = _score_direct(files, output_format, delimiter, scorer, target, spec.batch_size)
        else:
            rows_read = _score_on_ray_data(files, output_format, delimiter, colour_by_path, spec, prediction_column,
                                           target, missing_values)
    except Exception as err:
        if local:
            shutil.rmtree(target, ignore_errors=True)
        message = _user_error(err)
        if message is not None:
            raise DataSourceError(f"cannot score {spec.input_uri!r}: {message}") from None
        raise
    if local:
        os.rename(target, final_path)
    rows, summary = _summary(output_uri, output_format, prediction_column, card.classes is not None)
    dropped = 0 if rows_read is None else rows_read - rows
    log.info("wrote %d prediction(s) to %s: %s; missing values: %s%s", rows, output_uri, summary, missing_values,
             f" ({dropped} row(s) with a missing value left out)" if dropped else "")
    drift = report_drift(spec, preprocessor, version, files, output_format, delimiter, colour_by_path, output_uri)
    return ScoreResult(output_uri=output_uri, output_format=output_format, rows=rows,
                       prediction_column=prediction_column, model_dir=spec.model_dir, model_version=version,
                       input_uri=spec.input_uri, predictions=summary, engine=engine, engine_reason=why,
                       missing_values=missing_values, rows_dropped=dropped, drift=drift)


def drift_counts(files: list[str], output_format: str, delimiter: str | None, colour_by_path: bool,
                 preprocessor, max_rows: int) -> DriftCounter:
    """The input's feature values counted into the model's reference bins: at most ``max_rows`` rows,
    in file order, read with pyarrow (a CSV's columns as text, converted as the scorer converts them)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pads

    counter = DriftCounter(preprocessor.reference)
    columns = list(preprocessor.reference)
    for uri in files:
        filesystem, path = artifacts.resolve(uri)
        if output_format == "parquet":
            file_format = pads.ParquetFileFormat()
        else:
            file_format = pads.CsvFileFormat(parse_options=pacsv.ParseOptions(delimiter=delimiter),
                                             convert_options=pacsv.ConvertOptions(
                                                 column_types={column: pa.string() for column in columns}))
        dataset = pads.dataset(path, filesystem=filesystem, format=file_format)
        present = [column for column in columns if column in dataset.schema.names]
        for batch in dataset.to_batches(columns=present):
            frame = batch.to_pandas().iloc[:max_rows - counter.rows]
            if colour_by_path and TYPE_COLUMN not in frame:
                frame[TYPE_COLUMN] = colour_from_name(path)
            values, missing = {}, {}
            for column in columns:
                raw = frame[column]
                absent = _absent(raw)
                if column in preprocessor.categories:
                    values[column] = raw.astype(object).map(str).to_numpy()
                else:
                    numbers = (boolean_numbers(raw.to_numpy(dtype=object))[0] if column in preprocessor.boolean_columns
                               else pd.to_numeric(raw, errors="coerce").to_numpy(dtype="float64", na_value=np.nan))
                    absent = absent | ~np.isfinite(numbers)
                    values[column] = numbers
                missing[column] = absent
            counter.add(values, len(frame), missing)
            if counter.rows >= max_rows:
                return counter
    return counter


def report_drift(spec: ScoreSpec, preprocessor, version: str, files: list[str], output_format: str,
                 delimiter: str | None, colour_by_path: bool, output_uri: str) -> dict[str, Any]:
    """The input's drift against the model's training data, written beside the predictions as
    ``<output>.drift.json``; what the manifest carries of it (the whole report and its URI)."""
    if not spec.drift_max_rows:
        return {}
    if not preprocessor.reference:
        reason = (f"model {version} was trained before drift reports: its preprocessor holds no training "
                  "distributions to compare with; retrain it to get them")
        log.info("drift: unknown: %s", reason)
        return {"verdict": "unknown", "reason": reason, "model_version": version, "input_uri": spec.input_uri}
    counter = drift_counts(files, output_format, delimiter, colour_by_path, preprocessor, spec.drift_max_rows)
    report = drift_report(counter, spec.drift_watch, spec.drift_alert)
    report_uri = f"{output_uri.rstrip('/')}.drift.json"
    artifacts.write_json_atomic(report_uri, {**report, "model_version": version, "input_uri": spec.input_uri,
                                             "output_uri": output_uri})
    watched = {column: entry["psi"] for column, entry in report["columns"].items() if entry["verdict"] != "stable"}
    log.info("drift: %s over %d row(s) (PSI watch %g, alert %g)%s; report %s", report["verdict"], report["rows"],
             spec.drift_watch, spec.drift_alert, f": {report['reason'] or watched}" if watched else "", report_uri)
    return {**report, "report_uri": report_uri, "model_version": version, "input_uri": spec.input_uri}


def main(argv: list[str] | None = None) -> int:
    return run_stage(ScoreSpec, run_scoring, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
