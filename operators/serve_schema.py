"""The deploy gate's schema check: can the served champion score the challenger's test rows?

The gate compares two models on the challenger's test split, which only works while the champion
takes those rows and predicts the same thing. A team that drops or adds a column, moves to another
label, other classes or another task has changed the schema: the champion cannot be scored, and the
deploy decides by its ``on_schema_change`` setting instead (``RayServeDeployOperator``).

:class:`ModelSchema` is what a model takes and predicts, read from the champion's ``/metadata``
(its model card and input schema) or from the preprocessor that wrote the challenger's split;
:func:`schema_changes` says in words what the champion needs that the challenger's rows lack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_CHANGE_POLICIES = ("promote", "refuse")
"""What a deploy does when the champion cannot score the challenger's rows: serve the challenger
(the reason in the decision), or keep the champion."""
DEFAULT_ON_SCHEMA_CHANGE = "promote"
SCHEMA_CHANGED = "schema changed: champion needs "
"""How every schema-change reason starts (the decision's ``reason``, the note, the serving history)."""
MAX_LISTED = 10  # names or values quoted in one list of a reason; the rest are counted


@dataclass(frozen=True)
class ModelSchema:
    """What a model takes (its input columns and their kinds) and predicts (label, task, classes).

    :param input_columns: the raw columns a row must have, or None where the source does not say.
    :param numeric: the numeric input columns.
    :param categorical: per text input column, the categories it takes.
    """

    input_columns: list[str] | None
    numeric: list[str]
    categorical: dict[str, list[Any]]
    label_column: str | None
    task: str
    classes: list[Any] | None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> ModelSchema:
        """The served model's, from its ``/metadata`` answer (its card and ``schema``)."""
        schema = metadata.get("schema") if isinstance(metadata.get("schema"), dict) else {}
        columns = schema.get("input_columns")
        return cls(input_columns=list(columns) if isinstance(columns, list) else None,
                   numeric=list(schema.get("numeric") or []),
                   categorical={column: list(values) for column, values in (schema.get("categorical") or {}).items()},
                   label_column=metadata.get("label_column") or None,
                   task=metadata.get("task") or "regression", classes=metadata.get("classes"))

    @classmethod
    def from_preprocessor(cls, preprocessor: Any) -> ModelSchema:
        """The challenger's rows', from the preprocessor that wrote its split
        (``airflow_ray_ml_stages.preprocessor.Preprocessor``)."""
        return cls(input_columns=list(preprocessor.input_columns), numeric=list(preprocessor.numeric_columns),
                   categorical={column: list(values) for column, values in preprocessor.categories.items()},
                   label_column=preprocessor.label_column or None, task=preprocessor.task,
                   classes=None if preprocessor.classes is None else list(preprocessor.classes))

    def kind(self, column: str) -> str | None:
        """``a number`` or ``text`` as the schema types the column; None for a kind it does not name."""
        if column in self.numeric:
            return "a number"
        if column in self.categorical:
            return "text"
        return None


def _listed(values: list[Any]) -> str:
    """A list for a reason: its first MAX_LISTED items, and how many more."""
    shown = repr(list(values[:MAX_LISTED]))
    return shown if len(values) <= MAX_LISTED else f"{shown[:-1]}, … {len(values) - MAX_LISTED} more]"


def schema_changes(champion: ModelSchema, challenger: ModelSchema) -> list[str]:
    """What the champion needs that the challenger's rows and labels do not give, one phrase each,
    to follow "champion needs"; ``[]`` when the champion can score the challenger's test split."""
    changes = []
    if champion.task != challenger.task:
        changes.append(f"a {champion.task} label, the challenger is a {challenger.task} model")
    if champion.label_column and challenger.label_column and champion.label_column != challenger.label_column:
        changes.append(f"label {champion.label_column!r}, the challenger predicts {challenger.label_column!r}")
    if (champion.task == challenger.task == "classification" and champion.classes is not None
            and challenger.classes is not None and set(champion.classes) != set(challenger.classes)):
        changes.append(f"classes {_listed(champion.classes)}, the challenger's are {_listed(challenger.classes)}")
    if champion.input_columns is None or challenger.input_columns is None:
        return changes
    missing = [column for column in champion.input_columns if column not in challenger.input_columns]
    new = [column for column in challenger.input_columns if column not in champion.input_columns]
    if missing:
        changes.append(f"{_listed(missing)}, which the challenger's data lacks")
    if new:
        changes.append(f"none of {_listed(new)}, new in the challenger's data")
    for column in champion.input_columns:
        if column not in challenger.input_columns:
            continue
        kinds = champion.kind(column), challenger.kind(column)
        if kinds[0] != kinds[1] and None not in kinds:
            changes.append(f"{column!r} as {kinds[0]}, the challenger's data has it as {kinds[1]}")
        elif kinds == ("text", "text"):
            unknown = [value for value in challenger.categorical[column] if value not in champion.categorical[column]]
            if unknown:
                changes.append(f"{column!r} in {_listed(champion.categorical[column])}, the challenger's data "
                               f"also has {_listed(unknown)}")
    return changes


def schema_change_reason(changes: list[str]) -> str:
    """The decision's reason for a schema change: ``schema changed: champion needs …``."""
    return SCHEMA_CHANGED + "; ".join(changes)


def answer_problems(response: Any) -> str:
    """An endpoint's error answer in words: the fields its ``detail`` names and the kind of each
    problem (``'alcohol' (missing)``), never the body itself; ``""`` when it names none."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(detail, list):
        return ""
    seen: dict[str, None] = {}
    for problem in detail:
        if not isinstance(problem, dict):
            continue
        loc = problem.get("loc") if isinstance(problem.get("loc"), list) else []
        # ["body", "instances", <row>, <feature>]: the feature; a shorter one is the body or a row
        where = repr(loc[3]) if len(loc) > 3 and isinstance(loc[3], str) else "a row" if len(loc) == 3 else "the body"
        kind = problem.get("type") if isinstance(problem.get("type"), str) else "invalid"
        seen[f"{where[:80]} ({kind[:40]})"] = None
    named = list(seen)
    return ", ".join(named[:MAX_LISTED]) + (f", … {len(named) - MAX_LISTED} more" if len(named) > MAX_LISTED else "")
