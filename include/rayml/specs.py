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
