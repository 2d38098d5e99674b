"""Where a setting came from, and the one way a `ConfigError` names it: the file, or the variable that set it.

A value the environment set is reported as from "environment", its problem ending in "(set by VAR)"; any other
as from the file (or "environment" when there is none). Keys are dotted (`server.port`, `scopes[0]`). The provider
catalog (`service.providers`) reports its errors the same way, with these helpers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from service.core.errors import ConfigError

__all__ = [
    "CONFIG_ENV_VAR",
    "ENVIRONMENT",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "config_error_at",
    "dotted_key",
    "env_var_for",
    "nearest",
    "origin_error",
    "setting_env_var",
    "unknown_key_problem",
]

ENV_PREFIX = "CONNECTOR_"
ENV_NESTED_DELIMITER = "__"
CONFIG_ENV_VAR = "CONNECTOR_CONFIG"
ENVIRONMENT = "environment"


def setting_env_var(path: Sequence[str]) -> str:
    """The environment variable of a setting or section: `("server", "port")` -> `CONNECTOR_SERVER__PORT`."""
    return (ENV_PREFIX + ENV_NESTED_DELIMITER.join(path)).upper()


def env_var_for(loc: Sequence[str | int], environ: Mapping[str, str]) -> str | None:
    """The CONNECTOR_* variable that supplied the value at `loc`, if any (nested or whole-section JSON)."""
    names = [part for part in loc if isinstance(part, str)]
    present = {key.upper(): key for key, value in environ.items() if value != ""}
    for depth in range(len(names), 0, -1):
        candidate = setting_env_var(names[:depth])
        if candidate in present:
            return present[candidate]
    return None


def dotted_key(loc: Sequence[str | int]) -> str:
    """`("server", "port")` -> `server.port`; list positions in brackets: `("scopes", 0)` -> `scopes[0]`."""
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += ("." if key else "") + part
    return key or "<settings>"


def origin_error(file: str | Path | None, key: str, problem: str, set_by: str | None = None) -> ConfigError:
    """A ConfigError about `key`: from the environment naming the variable `set_by` when one set it, else from
    `file` (or the environment, when there is no file)."""
    if set_by is not None:
        return ConfigError(ENVIRONMENT, key, f"{problem} (set by {set_by})")
    return ConfigError(str(file) if file is not None else ENVIRONMENT, key, problem)


def config_error_at(
    loc: Sequence[str | int], problem: str, file: Path | None, environ: Mapping[str, str]
) -> ConfigError:
    """A ConfigError about the setting at `loc`, naming the CONNECTOR_* variable or the file that set it."""
    return origin_error(file, dotted_key(loc), problem, set_by=env_var_for(loc, environ))


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `name` (a likely typo), or None when none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_problem(key: str, valid: Iterable[str]) -> str:
    """ "unknown key", with the nearest valid key when one is close."""
    close = nearest(key, valid)
    return f"unknown key: did you mean '{close}'?" if close else "unknown key"
