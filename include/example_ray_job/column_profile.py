"""Your own Ray code, run from Airflow by ``RayJobOperator(entrypoint=...)``: profile a table's numeric columns.

It needs nothing of this project: each numeric column is summarised by a Ray task of its own, and
the profile is printed as the last line, one JSON object, which the operator returns as the task's
XCom. ``dags/ray_job_example.py`` runs it with this folder as the job's ``working_dir``::

    python column_profile.py --rows 20000 --seed 3          # a generated table
    python column_profile.py --source /data/sales.parquet   # a CSV or Parquet file the cluster reaches

``PROFILE_SOURCE`` in the environment, when set, is the default of ``--source``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pandas as pd
import ray


@ray.remote(num_cpus=0.25)
def summarise(values: np.ndarray) -> dict:
    """One column's summary (missing values left out of the statistics, and counted)."""
    present = values[~np.isnan(values)]
    stats = {"count": int(present.size), "missing": int(values.size - present.size)}
    if present.size:
        stats.update(mean=float(present.mean()), std=float(present.std()), min=float(present.min()),
                     max=float(present.max()))
    return stats


def generated(rows: int, seed: int) -> pd.DataFrame:
    """A weather-like table: three numeric columns with a few missing values, and a text column."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "temperature_c": rng.normal(14, 8, rows), "humidity_pct": rng.uniform(20, 100, rows),
        "wind_kmh": rng.gamma(2.0, 6.0, rows), "station": rng.choice(["north", "south", "coast"], rows),
    })
    frame.loc[rng.random(rows) < 0.01, "humidity_pct"] = np.nan
    return frame


def read(source: str) -> pd.DataFrame:
    return pd.read_parquet(source) if source.endswith(".parquet") else pd.read_csv(source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=os.environ.get("PROFILE_SOURCE") or None,
                        help="a CSV or Parquet file; default: $PROFILE_SOURCE, else a generated table")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    frame = read(args.source) if args.source else generated(args.rows, args.seed)
    numeric = [name for name in frame.columns if pd.api.types.is_numeric_dtype(frame[name])]
    if not numeric:
        print(f"column_profile: {args.source or 'the table'} has no numeric column; its columns are "
              f"{list(frame.columns)}", file=sys.stderr)
        return 2
    ray.init()  # inside a Ray job: joins the job's cluster
    summaries = ray.get([summarise.remote(frame[name].to_numpy(dtype=float)) for name in numeric])
    print(f"profiled {len(numeric)} numeric column(s) of {len(frame)} rows on the Ray cluster")
    print(json.dumps({"rows": len(frame), "columns": dict(zip(numeric, summaries))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
