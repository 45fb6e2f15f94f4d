"""One contract per stage: the Ray-side spec dataclass declares each setting once.

A stage's spec (``airflow_ray_ml_stages.specs.TrainSpec``, ``PreprocessSpec``, ...) holds every setting with its
type, its default, its doc (the ``:param:`` lines of its docstring) and its validation
(``__post_init__``). A stage operator names its spec and gets from it:

* its keyword arguments: one per spec field, the default being the spec's own;
* its ``template_fields``: those arguments, plus the operator's own templated arguments;
* its docs: the spec's ``:param:`` lines appended to the operator's docstring;
* its coercion: a value that a template rendered as text (a DAG without
  ``render_template_as_native_obj``) is turned into the field's type once, here, the same way for
  every operator (``"False"`` is false, ``"None"`` is None, ``"[0, 10]"`` is a list).

Validation stays where it is declared: the spec's ``from_dict`` runs in Airflow before any job
starts (:meth:`airflow_ray_ml.ray_job.RayJobOperator.full_spec`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import types
import typing
from typing import Any

from airflow_ray_ml.errors import InvalidSpecError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"", "none", "null"}
_PARAM = re.compile(r"^\s*:param (\w+):\s*(.*)$")


def _parse_literal(text: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError):
            continue
    return text


def _members(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a type hint (``int | None`` -> ``(int, NoneType)``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def coerce_value(value: Any, hint: Any, where: str) -> Any:
    """``value`` as type ``hint`` when a template rendered it as text; other values are left as they are.

    Text that cannot be read as the type is returned unchanged, so the spec's validation refuses
    it with its own message (which quotes the value and names the fix).
    """
    if not isinstance(value, str):
        return value
    members = _members(hint)
    bases = {typing.get_origin(member) or member for member in members}
    text = value.strip()
    if type(None) in bases and text.lower() in _NONE:
        return None
    if str in bases and not ({list, dict, tuple} & bases and text[:1] in "[{("):
        return value
    if bool in bases and text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    if int in bases and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if float in bases:
        try:
            return float(text)
        except ValueError:
            pass
    if {list, dict, tuple, Any} & bases and text[:1] in "[{(":
        parsed = _parse_literal(text)
        if parsed is text:
            raise InvalidSpecError(f"{where} must be a list or dict, got the text {value[:200]!r}")
        return list(parsed) if isinstance(parsed, tuple) else parsed
    return value


def coerce_spec(spec_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """Each value of a spec dict coerced to its field's type (unknown fields are left for validation)."""
    hints = typing.get_type_hints(spec_type)
    return {name: coerce_value(value, hints[name], f"{spec_type.__name__}.{name}") if name in hints else value
            for name, value in values.items()}


def spec_fields(spec_type: type, exclude: typing.Iterable[str] = ()) -> tuple[dataclasses.Field, ...]:
    """The spec's fields that an operator takes as arguments (``artifact_dir`` is the operator's own)."""
    skip = {"artifact_dir", *exclude}
    return tuple(field for field in dataclasses.fields(spec_type) if field.name not in skip)


def field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return None


def spec_param_docs(spec_type: type) -> dict[str, str]:
    """The ``:param name:`` lines of the spec's docstrings (its own and its bases'), continuation lines joined."""
    docs: dict[str, str] = {}
    for cls in reversed(spec_type.__mro__):
        current = None
        for line in (cls.__doc__ or "").splitlines():
            match = _PARAM.match(line)
            if match:
                current = match.group(1)
                docs[current] = match.group(2).strip()
            elif current and line.strip() and not line.strip().startswith(":"):
                docs[current] += " " + line.strip()
            else:
                current = None
    return docs


def params_doc(spec_type: type, names: typing.Iterable[str]) -> str:
    """reST ``:param:`` lines for the operator arguments that come from the spec."""
    docs = spec_param_docs(spec_type)
    return "\n".join(f"    :param {name}: {docs.get(name, '(see ' + spec_type.__name__ + ')')} (templated)"
                     for name in names)


def operator_setting(value: Any, hint: Any, where: str) -> Any:
    """An operator's own setting (not a spec field) coerced like a spec's, and checked for its type."""
    value = coerce_value(value, hint, where)
    allowed = tuple(typing.get_origin(member) or member for member in _members(hint))
    if float in allowed:
        allowed += (int,)
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        raise InvalidSpecError(f"{where} must be {' or '.join(t.__name__ for t in allowed)}, got {value!r}")
    return value
