"""What the wine DAG's Params cost Airflow: serializing the DAG, as the DAG processor does on every
parse (and ``dag.test()`` several times a run), with the ``search_space`` Param's JSON Schema
declared draft 7 (as shipped) and the same schema undeclared (read as 2020-12).

Airflow's ``Param`` checks its value with ``jsonschema.validate``, which checks the schema itself
against its draft's metaschema first, every time; serializing a DAG resolves each Param several
times per task. The two ways are timed interleaved, in one process, on the same parsed DAG.

Run: ``.venv/bin/python bench/bench_params.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "dags"), str(ROOT / "plugins"), str(ROOT), str(ROOT / "include")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="serializations each way")
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="bench-params-"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_ray_ml_stages.search_space import JSON_SCHEMA_DRAFT

    dag = DagBag(str(ROOT / "dags")).dags["wine_quality_pipeline"]
    # the DAG's Param and each task's copy of it
    schemas = [params.get_param("search_space").schema for params in (dag.params, *(t.params for t in dag.tasks))]
    assert all(schema.get("$schema") == JSON_SCHEMA_DRAFT for schema in schemas)

    def declared(on: bool) -> None:
        for schema in schemas:
            if on:
                schema["$schema"] = JSON_SCHEMA_DRAFT
            else:
                schema.pop("$schema", None)

    ways = {"search_space schema undeclared (2020-12)": False, "declared draft 7 (as shipped)": True}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, on in ways.items():
            declared(on)
            started = time.perf_counter()
            DagSerialization.serialize_dag(dag)
            times[way].append(time.perf_counter() - started)
    declared(True)
    base = statistics.median(times[next(iter(ways))])
    print(f"\nwine_quality_pipeline ({len(dag.tasks)} tasks, {len(dag.params)} Params), "
          f"{args.rounds} serializations each way, interleaved\n")
    print("| search_space Param's schema | serialize, median s | ratio to undeclared |")
    print("|---|---|---|")
    for way in ways:
        median = statistics.median(times[way])
        print(f"| {way} | {median:.3f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
