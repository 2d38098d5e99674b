"""How a setting's value may be written: a blank string is "not set" (TOML has no null), and the environment gives a
list as one comma-separated string. The sections use these, and so do verifier plugins for their own settings."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

__all__ = ["optional_secret", "optional_str", "split_list"]


def optional_str(value: Any) -> Any:
    """An empty or blank string means "not set" (TOML has no null)."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


def optional_secret(value: Any) -> Any:
    """`optional_str` for a secret field, which may arrive already wrapped (a `SecretStr` default or model)."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return optional_str(value)


def split_list(value: Any) -> Any:
    """A comma-separated string (the environment's way to give a list) becomes a list of its non-empty parts."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value
