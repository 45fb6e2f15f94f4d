"""What every spec builds on: a strict JSON round-trip, and field checks that quote the bad value.

Used by the stage specs (:mod:`airflow_ray_ml_stages.specs`) and the training config (:mod:`airflow_ray_ml_stages.train.config`);
every check raises :class:`~airflow_ray_ml_stages.errors.SpecError` naming the owner, the field and the value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, TypeVar

from airflow_ray_ml_stages.errors import SpecError

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


def is_number(value: Any) -> bool:
    """A finite int or float, as JSON has them: a bool is not one (Python counts True as 1), nor NaN or infinity."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def require_positive(owner: str, name: str, value: Any, *, or_zero: bool = False, or_none: bool = False,
                     unit: str = "") -> None:
    """``value`` is a number > 0 (``or_zero``: >= 0; ``or_none``: or None), in ``unit`` (e.g. seconds) if given."""
    if value is None and or_none:
        return
    if is_number(value) and (value > 0 or (or_zero and value == 0)):
        return
    what = f"a number{' of ' + unit if unit else ''} {'>=' if or_zero else '>'} 0{' or null' if or_none else ''}"
    if isinstance(value, bool):
        fix = "; true/false is not a number: give the number itself"
    elif isinstance(value, str):
        fix = "; give the number itself, not text"
    elif isinstance(value, float) and not math.isfinite(value):
        fix = "; give a finite number"
    else:
        fix = ""
    raise SpecError(f"{owner}.{name} must be {what}, got {value!r}{fix}")


def require_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{owner}.{name} must be one of {list(choices)}, got {value!r}")
