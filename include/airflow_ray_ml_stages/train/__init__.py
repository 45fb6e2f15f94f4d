"""Stage ``train``: fit a Lightning MLP or an XGBoost booster on Ray Train and write a model directory.

Run as ``python -m airflow_ray_ml_stages.train --spec '<json>'`` (a Ray job). The stage

1. sizes the run: GPU or CPU from the probe's answer and the size of the work
   (:mod:`airflow_ray_ml_stages.device`), then Train's local mode below ``scale_out_min_rows``
   training rows (Ray Train's fixed start-up cost dominates at wine scale), the compute spec's
   workers above it; a local-mode run reading the splits directly runs the same loop in the
   job's process without Ray Train at all (no ``ray.init``, no ``ray.train`` import), on the GPU
   given to the job where the device is the GPU;
2. on a GPU compute spec, first checks that the workers' GPU placement can be had within
   ``gpu_placement_timeout_s``, and trains on CPU (saying so in the log and the manifest) if not;
3. trains with ``TorchTrainer`` + ``ray.train.lightning`` or ``XGBoostTrainer`` (V2 API), reading
   the splits as Ray Datasets, checkpointing into the run's artifact directory under a run name
   derived from it, with ``FailureConfig`` so a killed worker resumes from the last checkpoint;
4. has rank 0 evaluate the trained model in the worker and write the weights (tensors-only
   ``model.pt`` or XGBoost's ``model.ubj``) and its validation/test predictions;
5. computes the metrics, a mean-predictor baseline, and writes the model card.

Modules, in the order a run uses them:

- :mod:`airflow_ray_ml_stages.train.stage`: :func:`~airflow_ray_ml_stages.train.stage.run_training` and ``main``, the entry point;
- :mod:`airflow_ray_ml_stages.train.config`: each family's hyperparameter defaults and their validation;
- :mod:`airflow_ray_ml_stages.train.sizing`: right-sizing (workers, GPU placement);
- :mod:`airflow_ray_ml_stages.train.splits`: reading the splits, and the map to another scaler;
- :mod:`airflow_ray_ml_stages.train.loop_config`: what a loop is given (:class:`~airflow_ray_ml_stages.train.loop_config.TrainLoopConfig`);
- :mod:`airflow_ray_ml_stages.train.contexts`: where a loop runs (Ray Train worker, Tune trial, the job's process);
- :mod:`airflow_ray_ml_stages.train.loops`: the Lightning and XGBoost training loops;
- :mod:`airflow_ray_ml_stages.train.run_dir`: the files a loop leaves for the driver, and the Ray Train run's name;
- :mod:`airflow_ray_ml_stages.train.finish`: metrics, baseline and the model card.

This ``__init__`` imports nothing, so importing one module loads only what that module needs:
:mod:`airflow_ray_ml_stages.specs`, which the Airflow side imports, imports :mod:`airflow_ray_ml_stages.train.config`, and must
not bring numpy or pyarrow with it.
"""
