"""Stage specs and results: dataclasses that travel as JSON between Airflow and Ray.

Every spec validates itself in ``__post_init__`` and quotes the bad value, so a mistake in a DAG is
reported before any Ray job starts. ``to_dict``/``from_dict`` round-trip through plain JSON types.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar, TypeVar

from rayml.errors import SpecError

SpecT = TypeVar("SpecT", bound="JsonDataclass")


class JsonDataclass:
    """Mixin giving a dataclass a strict JSON round-trip."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls: type[SpecT], data: dict[str, Any]) -> SpecT:
        if not isinstance(data, dict):
            raise SpecError(f"{cls.__name__} needs a JSON object, got {data!r}")
        known = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(
                f"{cls.__name__} got unknown field(s) {unknown}; the known fields are {sorted(known)}"
            )
        try:
            return cls(**data)
        except TypeError as err:
            raise SpecError(f"{cls.__name__}: {err}") from err

    @classmethod
    def from_json(cls: type[SpecT], text: str) -> SpecT:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"{cls.__name__} spec is not valid JSON ({err}): {text[:200]!r}") from err
        return cls.from_dict(data)


def require_non_empty(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"{owner}.{name} must be a non-empty string, got {value!r}")


def require_int_range(owner: str, name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
        high is not None and value > high
    ):
        upper = "" if high is None else f" and <= {high}"
        raise SpecError(f"{owner}.{name} must be an integer >= {low}{upper}, got {value!r}")


def require_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")


@dataclasses.dataclass
class StageSpec(JsonDataclass):
    """Fields every stage spec has.

    :param artifact_dir: URI of this task run's directory (``<root>/<dag>/<run>/<task>``); the
        stage writes its outputs and ``manifest.json`` there.
    """

    stage: ClassVar[str] = ""
    artifact_dir: str

    def __post_init__(self) -> None:
        require_non_empty(type(self).__name__, "artifact_dir", self.artifact_dir)


@dataclasses.dataclass
class GenerateSpec(StageSpec):
    """Spec of the ``generate`` stage, which writes the demo wine-quality data set.

    :param rows: total number of rows (red and white together, in the UCI proportion).
    :param seed: random seed; the same seed gives the same file.
    :param file_format: ``uci`` (semicolon-separated with quoted header, as published),
        ``csv`` (comma-separated) or ``parquet``.
    """

    stage: ClassVar[str] = "generate"
    rows: int = 6497
    seed: int = 7
    file_format: str = "uci"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int_range("GenerateSpec", "rows", self.rows, 2)
        require_int_range("GenerateSpec", "seed", self.seed, 0)
        require_choice("GenerateSpec", "file_format", self.file_format, ("uci", "csv", "parquet"))


@dataclasses.dataclass
class GenerateResult(JsonDataclass):
    data_uris: list[str]
    rows: int
    rows_by_type: dict[str, int]
    fingerprint: str


ACCELERATORS = ("gpu", "cpu")


@dataclasses.dataclass
class ComputeSpec(JsonDataclass):
    """How training, tuning and serving run: decided once per Airflow run by the GPU probe.

    :param use_gpu: whether workers get GPUs.
    :param gpus_per_worker: GPUs each worker requests (0 on CPU).
    :param num_workers: the most workers the cluster supports; stages may use fewer for small data.
    :param cpus_per_worker: CPUs each worker requests; sized to leave Ray Data CPU headroom.
    :param accelerator: the PyTorch Lightning accelerator, ``gpu`` or ``cpu``.
    :param devices: the GPUs found: node, name, memory (GiB) and whether CUDA could use them.
    :param reason: why this was decided, in one human sentence.
    :param cluster: what the probe saw: nodes, CPUs and GPUs in total.
    :param decided_in_s: how long the decision took.
    """

    use_gpu: bool
    gpus_per_worker: float
    num_workers: int
    cpus_per_worker: float
    accelerator: str
    reason: str
    devices: list[dict] = dataclasses.field(default_factory=list)
    cluster: dict = dataclasses.field(default_factory=dict)
    decided_in_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.use_gpu, bool):
            raise SpecError(f"ComputeSpec.use_gpu must be true or false, got {self.use_gpu!r}")
        require_int_range("ComputeSpec", "num_workers", self.num_workers, 1)
        require_choice("ComputeSpec", "accelerator", self.accelerator, ACCELERATORS)
        if not isinstance(self.cpus_per_worker, (int, float)) or self.cpus_per_worker <= 0:
            raise SpecError(f"ComputeSpec.cpus_per_worker must be a number > 0, got {self.cpus_per_worker!r}")
        if self.use_gpu != (self.gpus_per_worker > 0) or self.use_gpu != (self.accelerator == "gpu"):
            raise SpecError(
                "ComputeSpec is inconsistent: use_gpu, gpus_per_worker > 0 and accelerator == 'gpu' "
                f"must agree, got use_gpu={self.use_gpu!r}, gpus_per_worker={self.gpus_per_worker!r}, "
                f"accelerator={self.accelerator!r}"
            )

    @classmethod
    def cpu(cls, reason: str, num_workers: int = 1, cpus_per_worker: float = 1.0, **fields: Any) -> "ComputeSpec":
        return cls(use_gpu=False, gpus_per_worker=0, num_workers=num_workers,
                   cpus_per_worker=cpus_per_worker, accelerator="cpu", reason=reason, **fields)

    def summary(self) -> str:
        """The decision as one readable line (the task log shows this)."""
        where = (
            f"GPU: {self.num_workers} worker(s) x {self.gpus_per_worker:g} GPU + {self.cpus_per_worker:g} CPU"
            if self.use_gpu
            else f"CPU: {self.num_workers} worker(s) x {self.cpus_per_worker:g} CPU"
        )
        return f"{where} - {self.reason} (decided in {self.decided_in_s:.2f} s)"


@dataclasses.dataclass
class ProbeSpec(StageSpec):
    """Spec of the ``probe`` stage: check advertised GPUs with a real CUDA smoke test.

    :param wait_for_gpu_s: on autoscaling clusters, ask for a GPU and wait up to this long.
    :param smoke_timeout_s: how long the CUDA smoke test may take once a GPU is placed.
    :param max_workers: the most training workers to plan for.
    """

    stage: ClassVar[str] = "probe"
    wait_for_gpu_s: float = 0.0
    smoke_timeout_s: float = 60.0
    max_workers: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("wait_for_gpu_s", "smoke_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SpecError(f"ProbeSpec.{name} must be a number of seconds >= 0, got {value!r}")
        require_int_range("ProbeSpec", "max_workers", self.max_workers, 1)
