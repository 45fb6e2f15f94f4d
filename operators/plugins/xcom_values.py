"""XCom values as the metadata database holds them, read back by the api-server and the scheduler."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class _Row:
    """What ``XComModel.deserialize_value`` reads from a result row."""

    value: Any


def decode_xcom(value: Any) -> Any:
    """An XCom's stored value as the task pushed it; None when it cannot be read."""
    from airflow.models.xcom import XComModel

    try:
        return XComModel.deserialize_value(_Row(value))
    except Exception:
        try:
            return json.loads(value) if isinstance(value, (str, bytes)) else value
        except ValueError:
            return None
