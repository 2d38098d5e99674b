"""`load_settings`: the one entry point that reads the config file and the environment into `Settings`.

Every problem it finds becomes a `ConfigError` naming the file (or "environment") and the dotted key, never the
value (`config_error_at`).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings.exceptions import SettingsError

from service.core.errors import ConfigError

from .origins import CONFIG_ENV_VAR, ENV_PREFIX, ENVIRONMENT, config_error_at, env_var_for, unknown_key_problem
from .settings import Settings, connector_environment, keys_at, problem_of, reading

__all__ = ["DEFAULT_CONFIG_PATH", "load_settings"]

DEFAULT_CONFIG_PATH = Path("config/connector.toml")

# Keys of the TOML file that are refused although they name settings, with the reason.
_FORBIDDEN_TOML_KEYS: dict[tuple[str, ...], str] = {
    ("config_file",): "unknown key: config_file is set by the loader, not read from the file",
    ("vault", "keys"): (
        "key material does not belong in the config file: use vault.key_file (a file only its owner can "
        "read) or the CONNECTOR_VAULT__KEYS environment variable"
    ),
    ("metrics", "bearer_token"): (
        "the metrics token does not belong in the config file: set CONNECTOR_METRICS__BEARER_TOKEN"
    ),
    ("admin", "api_key"): "the operator API key does not belong in the config file: set CONNECTOR_ADMIN__API_KEY",
    ("admin", "oidc_client_secret"): (
        "client secrets do not belong in the config file: set CONNECTOR_ADMIN__OIDC_CLIENT_SECRET"
    ),
    ("identity", "oidc", "client_secret"): (
        "client secrets do not belong in the config file: set CONNECTOR_IDENTITY__OIDC__CLIENT_SECRET"
    ),
}


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Load settings from `path`, else $CONNECTOR_CONFIG, else config/connector.toml if it exists.

    Without a file: defaults and the environment only. `env` replaces os.environ (tests, embedding).
    Raises ConfigError on the first problem found.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    config_file = _choose_config_file(path, environ)
    if config_file is not None:
        _read_toml(config_file)  # syntax and forbidden keys, with a clear error, before pydantic sees it
    settings = _validated(config_file, environ)
    for key, value in (settings.identity.model_extra or {}).items():
        if not isinstance(value, dict):  # only [identity.<name>] tables are free-form; any other key is a typo
            raise config_error_at(
                ("identity", key), unknown_key_problem(key, keys_at(("identity",))), config_file, environ
            )
    loaded = _with_paths_resolved(settings, config_file, environ)
    loaded._env = connector_environment(environ)
    for key, value in (loaded.providers.model_extra or {}).items():
        if not isinstance(value, dict):  # a provider table (CONNECTOR_PROVIDERS__<NAME>__<KEY>) is a dict
            raise loaded.config_error(("providers", key), "unknown key")
    return loaded


def _validated(config_file: Path | None, environ: Mapping[str, str]) -> Settings:
    try:
        with reading(config_file, environ):
            return Settings()
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        raise config_error_at(tuple(error["loc"]), problem_of(error), config_file, environ) from None
    except SettingsError as exc:
        # Raised by pydantic-settings when an environment value cannot be decoded (e.g. bad JSON). Its message
        # names the top-level field, never the value.
        match = re.search(r'field "([^"]+)"', str(exc))
        key = match.group(1) if match else "<environment>"
        env_var = (ENV_PREFIX + key).upper() if match else "a CONNECTOR_* variable"
        raise ConfigError(ENVIRONMENT, key, f"{env_var} (or one of its {env_var}__* parts) cannot be parsed") from None


def _with_paths_resolved(settings: Settings, config_file: Path | None, environ: Mapping[str, str]) -> Settings:
    """Paths written in the file are relative to the file; those from the environment to the working directory."""
    base = config_file.resolve().parent if config_file is not None else None

    def resolved(value: Path, loc: tuple[str, ...]) -> Path:
        if value.is_absolute() or base is None or env_var_for(loc, environ) is not None:
            return value
        return Path(os.path.normpath(base / value))

    key_file = settings.vault.key_file
    return settings.model_copy(
        update={
            "vault": settings.vault.model_copy(
                update={"key_file": resolved(key_file, ("vault", "key_file")) if key_file is not None else None}
            ),
            "providers": settings.providers.model_copy(
                update={"catalog": resolved(settings.providers.catalog, ("providers", "catalog"))}
            ),
            "config_file": config_file.resolve() if config_file is not None else None,
        }
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message names line and column but never quotes the content.
        raise ConfigError(str(path), "<toml>", f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; the offset finds the byte without quoting the content
        raise ConfigError(str(path), "<file>", f"not UTF-8 text (byte {exc.start} cannot be read as UTF-8)") from None
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot be read: {exc.strerror or exc}") from None
    _refuse_provider_tables(data, path)
    _refuse_forbidden_keys(data, path)
    return data


def _refuse_provider_tables(data: dict[str, Any], path: Path) -> None:
    providers = data.get("providers")
    for key, value in providers.items() if isinstance(providers, dict) else ():
        if isinstance(value, dict):
            raise ConfigError(
                str(path),
                f"providers.{key}",
                "provider tables belong in the catalog file (providers.catalog) or in "
                "CONNECTOR_PROVIDERS__<NAME>__<KEY> environment variables",
            )


def _refuse_forbidden_keys(data: dict[str, Any], path: Path) -> None:
    for key_path, reason in _FORBIDDEN_TOML_KEYS.items():
        node: Any = data
        for part in key_path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise ConfigError(str(path), ".".join(key_path), reason)


def _choose_config_file(path: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    if path is not None:
        chosen = Path(path)
    elif environ.get(CONFIG_ENV_VAR):
        chosen = Path(environ[CONFIG_ENV_VAR])
    elif DEFAULT_CONFIG_PATH.is_file():
        return DEFAULT_CONFIG_PATH
    else:
        return None
    if not chosen.is_file():
        origin = CONFIG_ENV_VAR if path is None else "the given path"
        problem = "is a directory, not a config file" if chosen.is_dir() else "config file not found"
        raise ConfigError(str(chosen), "<file>", f"{problem} (from {origin})")
    return chosen
