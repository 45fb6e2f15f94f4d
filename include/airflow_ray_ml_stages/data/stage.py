"""The ``data`` stage's entry: :func:`run_preprocess` (``python -m airflow_ray_ml_stages.data --spec '<json>'``).

Inspect the sources and plan the columns, run pass 1 on the chosen engine and raise any failed
check, fit the preprocessor on the train split's summary, then run pass 2 and write the splits,
every scaler's preprocessor and the profile. Classification adds a step after pass 1: the classes
and their stratified cut points, then the per-split summary the preprocessor is fitted on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time

import numpy as np

from airflow_ray_ml_stages import artifacts
from airflow_ray_ml_stages.constants import SCALERS
from airflow_ray_ml_stages.data.batch import BatchContext
from airflow_ray_ml_stages.data.deferred_pandas import pandas_deferred
from airflow_ray_ml_stages.data.engines import (BATCH_ROWS, available_cores, choose_engine, connect_ray, profile_direct, ray_uri,
                                read_dataset, summarise_ray_batch, summarise_splits_direct, transform_ray_batch,
                                write_direct)
from airflow_ray_ml_stages.data.labels import fit_classes
from airflow_ray_ml_stages.data.profile import build_profile, medians, merge_split_summaries, merge_summaries
from airflow_ray_ml_stages.data.schema import plan_columns
from airflow_ray_ml_stages.data.sources import download, fingerprint_sources, inspect_source, reader_path
from airflow_ray_ml_stages.data.split import SPLIT_COLUMN, SPLITS
from airflow_ray_ml_stages.data.validation import diagnose_csv, raise_findings
from airflow_ray_ml_stages.drift import training_reference
from airflow_ray_ml_stages.errors import DataSourceError, quotable
from airflow_ray_ml_stages.preprocessor import Preprocessor
from airflow_ray_ml_stages.specs import PreprocessResult, PreprocessSpec
from airflow_ray_ml_stages.stage import run_stage

log = logging.getLogger("airflow_ray_ml_stages.data")


def run_preprocess(spec: PreprocessSpec) -> PreprocessResult:
    """Validate, split, fit and write everything ``spec`` asks for; return what was written."""
    scratch = tempfile.mkdtemp(prefix="rayml-data-")
    try:
        with pandas_deferred():
            return _run(spec, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(spec: PreprocessSpec, scratch: str) -> PreprocessResult:
    layouts = []
    for uri in spec.source:
        path = download(uri, scratch) if uri.startswith(("http://", "https://")) else reader_path(uri)
        layouts.append(inspect_source(uri, path, spec))
    plan = plan_columns(layouts, spec)
    log.info("sources %s: numeric %s, boolean %s, categorical %s, label %r%s", spec.source, plan.numeric, plan.boolean,
             plan.categorical, plan.label, " (text)" if plan.label_text else "")
    ctx = BatchContext([*plan.numeric, *plan.boolean], plan.categorical, plan.label, list(spec.split), spec.seed,
                       spec.nan_policy, spec.label_range, {l.path: l.uri for l in layouts},
                       {l.uri: l.derived for l in layouts}, task=spec.task, label_text=plan.label_text,
                       label_threshold=spec.label_threshold, max_categories=spec.max_categories,
                       boolean=plan.boolean)
    width = len(ctx.numeric) + 1  # the numeric and boolean columns and the label

    fingerprint: dict[str, str] = {}
    hasher = threading.Thread(target=fingerprint_sources, args=(layouts, fingerprint), daemon=True)
    hasher.start()
    engine, engine_reason = choose_engine(spec, layouts)
    log.info("engine %s: %s", engine, engine_reason)
    workers = available_cores()
    rows_dir = os.path.join(scratch, "rows")
    os.makedirs(rows_dir)
    dataset = None
    started = time.perf_counter()
    try:
        if engine == "direct":
            total = profile_direct(layouts, ctx, rows_dir, workers)
        else:
            connect_ray()
            dataset = read_dataset(layouts, plan, spec)
            rows = dataset.map_batches(summarise_ray_batch, batch_format="pyarrow", batch_size=BATCH_ROWS,
                                       fn_kwargs={"ctx": ctx}).take_all()
            total = merge_summaries((json.loads(row["summary"]) for row in rows), width, spec.max_categories)
    except DataSourceError:
        raise
    except Exception:
        # The typed CSV read fails on the first non-numeric value with a message naming neither
        # the row nor (reliably) the column: find them, or re-raise the original error.
        diagnose_csv(layouts, plan)
        raise
    log.info("pass 1 (validate, split, summarise) over %d rows in %.2f s", total["rows"], time.perf_counter() - started)
    raise_findings(total, ctx)
    dropped = total["rows"] - total["kept"]
    if dropped:
        log.warning("dropped %d of %d rows with NaN, infinite or missing values: %s", dropped, total["rows"],
                    {c: f["count"] for c, f in total["non_finite"].items()})
    if ctx.stratified:
        # A row's split needs its class's cut points, known only now: summarise the splits again.
        ctx.classes, ctx.cuts = fit_classes(total["classes"], ctx)
        started = time.perf_counter()
        if engine == "direct":
            total["splits"] = summarise_splits_direct(rows_dir, ctx, workers)
        else:
            rows = dataset.map_batches(summarise_ray_batch, batch_format="pyarrow", batch_size=BATCH_ROWS,
                                       fn_kwargs={"ctx": ctx}).take_all()
            total["splits"] = merge_split_summaries((json.loads(row["summary"])["splits"] for row in rows), width)
        log.info("classes %s; stratified split summarised in %.2f s", ctx.classes, time.perf_counter() - started)

    train = total["splits"]["train"]
    categories = {}
    for column in plan.categorical:
        values = sorted(train["categories"].get(column, {}))
        if len(values) > spec.max_categories:
            raise DataSourceError(
                f"categorical column {column!r} has {len(values)} distinct training values (more than "
                f"max_categories={spec.max_categories}), e.g. {quotable(values[:5])}: leave it out (drop_columns) or "
                "raise max_categories"
            )
        categories[column] = values
    width = len(plan.numeric)  # the scaler's columns: without the booleans and the label
    train_moments = train["moments"].columns(width)
    fill = imputation(total, plan, categories) if spec.nan_policy == "impute" else {}
    if fill:
        # the scaler sees the training values as the splits will hold them: imputed
        train_moments = train_moments.filled(np.array([fill.get(column, 0.0) for column in plan.numeric]))
        log.info("imputing missing values from the training split (median, most frequent category): %s",
                 {column: f"{count} row(s) -> {fill[column]!r}" for column, count in total["imputed"].items()}
                 or "none is missing")
    # what batch scoring measures a file's drift against: the training split's distributions
    reference = training_reference(train, [*plan.numeric, *plan.boolean], plan.categorical)
    preprocessor = Preprocessor.fit(spec.scaler, plan.numeric, train_moments, categories, plan.label, spec.task,
                                    ctx.classes, plan.boolean, fill, reference)
    hasher.join()

    # Everything is valid: now write.
    started = time.perf_counter()
    splits_dir = artifacts.join(spec.artifact_dir, "splits")
    artifacts.makedirs(spec.artifact_dir)
    if engine == "direct":
        write_direct(splits_dir, rows_dir, ctx, preprocessor, total["label_integral"], workers)
    else:
        output = dataset.map_batches(
            transform_ray_batch, batch_format="pyarrow", batch_size=BATCH_ROWS,
            fn_kwargs={"ctx": ctx, "preprocessor": preprocessor.to_dict(), "label_integral": total["label_integral"]},
        )
        output.write_parquet(ray_uri(splits_dir), partition_cols=[SPLIT_COLUMN])
    log.info("pass 2 (transform, write) in %.2f s", time.perf_counter() - started)
    preprocessor_uri = artifacts.join(spec.artifact_dir, "preprocessor.json")
    artifacts.write_bytes_atomic(preprocessor_uri, preprocessor.to_json().encode("utf-8"))
    # Every scaler fitted on the same training statistics (the moments hold all of them): a tuning
    # trial or the train stage maps the written splits to another scaler exactly, without a refit.
    variants = {}
    for scaler in SCALERS:
        variant = Preprocessor.fit(scaler, plan.numeric, train_moments, categories, plan.label, spec.task, ctx.classes,
                                   plan.boolean, fill, reference)
        variants[scaler] = artifacts.join(spec.artifact_dir, "preprocessors", f"{scaler}.json")
        artifacts.write_bytes_atomic(variants[scaler], variant.to_json().encode("utf-8"))
    profile_uri = artifacts.join(spec.artifact_dir, "profile.json")
    profile = build_profile(total, plan, spec, layouts, fingerprint.get("fingerprint", ""), ctx.classes)
    profile["engine"] = {"name": engine, "reason": engine_reason}
    artifacts.write_json_atomic(profile_uri, profile)
    counts = {name: total["splits"][name]["rows"] for name in SPLITS}
    return PreprocessResult(
        split_uris={name: (artifacts.join(splits_dir, f"{SPLIT_COLUMN}={name}") if counts[name] else None)
                    for name in SPLITS},
        preprocessor_uri=preprocessor_uri,
        profile_uri=profile_uri,
        rows=counts,
        rows_read=total["rows"],
        rows_dropped=dropped,
        feature_columns=preprocessor.output_columns,
        label_column=plan.label,
        fingerprint=fingerprint.get("fingerprint", ""),
        preprocessor_variants=variants,
        task=spec.task,
        classes=ctx.classes,
    )


def imputation(total: dict, plan, categories: dict[str, list[str]]) -> dict[str, float | str]:
    """``nan_policy='impute'``: each feature column's value for a missing one, from the training split only.

    A numeric or boolean column's median, a categorical column's most frequent value (the first in
    sorted order of equally frequent ones). Every feature gets one, so serving and scoring impute a
    value missing where training had none; a column that misses every training value cannot be
    imputed, and fails the run naming it.
    """
    train = total["splits"]["train"]
    fill: dict[str, float | str] = {}
    found = medians(train.get("samples") or [[] for _ in [*plan.numeric, *plan.boolean]])
    for column, median in zip([*plan.numeric, *plan.boolean], found):
        fill[column] = median
    for column in plan.categorical:
        counts = train["categories"].get(column, {})
        fill[column] = max(sorted(counts), key=lambda value: counts[value]) if counts else None
    empty = sorted(column for column, value in fill.items() if value is None)
    if empty:
        raise DataSourceError(f"column(s) {empty} have no value in any training row, so there is nothing to impute "
                              "them from: leave them out (drop_columns) or fix the data")
    return fill


def main(argv: list[str] | None = None) -> int:
    return run_stage(PreprocessSpec, run_preprocess, argv)
