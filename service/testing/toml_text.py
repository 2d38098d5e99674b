"""Writing a providers.toml table from a dict (strings, booleans, numbers, lists, nested tables as inline tables)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def toml_value(value: Any) -> str:
    """`value` as TOML: JSON's string escapes are TOML's basic-string escapes; tables are written inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_table(name: str, table: Mapping[str, Any]) -> str:
    """`[name]` and one `key = value` line per entry of `table` (None values left out)."""
    lines = [f"[{name}]"]
    lines += [f"{json.dumps(key)} = {toml_value(value)}" for key, value in table.items() if value is not None]
    return "\n".join(lines) + "\n"


__all__ = ["toml_table", "toml_value"]
