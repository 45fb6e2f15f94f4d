"""Stage ``data``: validate, split, fit a scaler on the train split and write Parquet.

Two streaming passes over the sources, so a table larger than memory is never loaded whole:

1. *profile*: every batch is checked (non-numeric, NaN/infinite/missing values, labels out of
   range) and summarised per split (row counts, mergeable moments, category and label counts);
   the summaries are merged. Any failed check raises here, before anything is written. Header
   checks (empty file, wrong delimiter, duplicate, missing or unexpected columns) run even
   earlier, on the first bytes of each file.
2. *write*: every batch is transformed by the preprocessor fitted on the train split's summary
   and written as Parquet, one directory per split.

Two engines run the same per-batch functions (:func:`choose_engine` picks one):

- ``direct``: pyarrow in the job's driver, batches processed on a thread per core; pass 1 keeps
  the canonical kept rows and their split in local Arrow IPC scratch files, so pass 2 neither
  parses the input again nor rehashes. No Ray Data start-up, no ``ray.init``.
- ``ray_data``: Ray Data tasks across the cluster (one fused read -> map -> write task per file),
  for inputs large enough that other nodes' CPUs pay for its start-up.

A row's split is a seeded hash of its content (the values of its used columns, in sorted column
order), so the same input and seed give the same split membership whatever the engine, the
block count, the number of CPUs, the order of the files or their format (UCI semicolon, comma CSV
or Parquet).

With ``task="classification"`` the split is stratified by class: pass 1 also counts each class's
rows per hash bin, the classes and each class's cut points follow (or a bad-label error), and a
second summary pass gives the per-split statistics before pass 2 writes each row's class index as
its label.

Modules, in the order a run uses them:

- :mod:`airflow_ray_ml_stages.data.stage`: :func:`~airflow_ray_ml_stages.data.stage.run_preprocess` and ``main``, the entry point;
- :mod:`airflow_ray_ml_stages.data.sources`: the input files: download, header checks, format and delimiter, fingerprint;
- :mod:`airflow_ray_ml_stages.data.schema`: the files' columns checked and planned (numeric, categorical, label);
- :mod:`airflow_ray_ml_stages.data.engines`: the direct and Ray Data engines, and which one runs;
- :mod:`airflow_ray_ml_stages.data.batch`: one batch in canonical types (from pyarrow or pandas);
- :mod:`airflow_ray_ml_stages.data.split`: the deterministic split (the seeded row hash);
- :mod:`airflow_ray_ml_stages.data.validation`: the row checks and their error messages;
- :mod:`airflow_ray_ml_stages.data.labels`: classification: the classes, per-class histograms, cut points, label checks;
- :mod:`airflow_ray_ml_stages.data.profile`: pass 1's summaries, merged, and the data profile;
- :mod:`airflow_ray_ml_stages.data.transform`: pass 2, the rows as written;
- :mod:`airflow_ray_ml_stages.data.deferred_pandas`: pandas imported only by the paths that need it.

This ``__init__`` imports nothing, so importing one module loads only what that module needs.
"""
