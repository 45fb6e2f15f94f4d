"""Airflow loads this file from its plugins folder: the "Ray ML" page (operators/plugins/ray_ml.py)."""

from operators.plugins.ray_ml import RayMLPlugin

__all__ = ["RayMLPlugin"]
