"""Stage ``generate``: write the seeded wine-quality stand-in into the run's artifacts.

``uci`` writes two files exactly as the UCI repository publishes them (``winequality-red.csv`` and
``winequality-white.csv``, semicolon-separated, quoted header, no ``type`` column); ``csv`` and
``parquet`` write one table with a ``type`` column.
"""

from __future__ import annotations

import io
import sys

from airflow_ray_ml_stages import artifacts, wine
from airflow_ray_ml_stages.specs import GenerateResult, GenerateSpec
from airflow_ray_ml_stages.stage import main_of, run_stage
from airflow_ray_ml_stages.tables import fingerprint


def _encode(frame, file_format: str) -> bytes:
    if file_format == "parquet":
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        return buffer.getvalue()
    return frame.to_csv(index=False).encode("utf-8")


def run_generate(spec: GenerateSpec) -> GenerateResult:
    """Generate the data set described by ``spec`` and return where it was written."""
    frame = wine.generate(rows=spec.rows, seed=spec.seed)
    if not spec.with_label:
        frame = frame.drop(columns=[wine.LABEL])
    if spec.file_format == "uci":
        files = {
            artifacts.join(spec.artifact_dir, f"winequality-{colour}.csv"): wine.to_uci_csv(
                frame[frame[wine.TYPE_COLUMN] == colour]
            )
            for colour in ("red", "white")
        }
    else:
        suffix = "parquet" if spec.file_format == "parquet" else "csv"
        files = {artifacts.join(spec.artifact_dir, f"{spec.name}.{suffix}"): _encode(frame, spec.file_format)}
    for uri, data in files.items():
        artifacts.write_bytes_atomic(uri, data)
    counts = frame[wine.TYPE_COLUMN].value_counts()
    return GenerateResult(
        data_uris=list(files),
        rows=len(frame),
        rows_by_type={colour: int(counts.get(colour, 0)) for colour in ("red", "white")},
        fingerprint=fingerprint(b"".join(files.values())),
    )


def main(argv: list[str] | None = None) -> int:
    return run_stage(GenerateSpec, run_generate, argv)


if __name__ == "__main__":
    sys.exit(main_of(__spec__.name))
