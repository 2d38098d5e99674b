"""Loading providers.toml: each table checked, environment overrides applied, credentials attached.

Every key of a provider's table can also be set (or overridden) by `CONNECTOR_PROVIDERS__<NAME>__<KEY>`; client
credentials come only from CONNECTOR_PROVIDER_<NAME>_CLIENT_ID / _CLIENT_SECRET. Errors name the file (or
"environment") and the key.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from service.config.origins import ENVIRONMENT, dotted_key
from service.core.errors import ConfigError
from service.core.urls import url_problem

from .credentials import CredentialSpec
from .entry import ENDPOINT_FIELDS, NAME_RE, TENANT_ID_PLACEHOLDER, ProviderCatalog, ProviderEntry
from .entry import provider_env_var as provider_env_var
from .quirks import PLACEHOLDER, Quirks, placeholders
from .table import CREDENTIAL_KEYS, OAUTH_ONLY_KEYS, QUIRK_KEYS, ProviderTable

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,127}$")
_DEFAULT_TENANT = "common"
_SECRET_KEYS = ("client_id", "client_secret")
# Optional text keys: an empty string means "not set", since TOML has no null.
_OPTIONAL_TEXT = frozenset(
    {*ENDPOINT_FIELDS, "display_name", "docs_url", "tenant", "token_endpoint_auth_method", "revoke_url"}
)
_RESERVED_PARAMS = frozenset(
    {
        "client_id",
        "client_secret",
        "redirect_uri",
        "response_type",
        "scope",
        "state",
        "nonce",
        "code",
        "code_challenge",
        "code_challenge_method",
        "code_verifier",
        "grant_type",
        "refresh_token",
    }
)
# Placeholders filled at use that are not per-connection values: {client_id} (GitHub's revocation URL).
_CLIENT_PLACEHOLDERS = {"revocation_endpoint": {"client_id"}}
# `CONNECTOR_PROVIDERS__<NAME>__<KEY>`: one catalog key of one provider, from the environment.
PROVIDERS_ENV_PREFIX = "CONNECTOR_PROVIDERS__"
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def provider_setting_env_vars(name: str) -> list[str]:
    """Every `CONNECTOR_PROVIDERS__<NAME>__<KEY>` variable that sets a catalog key of provider `name`."""
    return [provider_setting_env_var(name, key) for key in ProviderTable.model_fields]


def provider_setting_env_var(name: str, key: str) -> str:
    """`CONNECTOR_PROVIDERS__<NAME>__<KEY>`, NAME and KEY upper-cased, '-' in NAME written as '_'."""
    return f"{PROVIDERS_ENV_PREFIX}{name.upper().replace('-', '_')}__{key.upper()}"


def _blank_is_none(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return None
    return value


def _read_catalog_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "provider catalog not found (providers.catalog)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "<toml>", f"not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot be read: {exc.strerror or exc}") from None


def _env_tables(environ: Mapping[str, str]) -> dict[str, dict[str, tuple[str, str]]]:
    """Provider settings in the environment: {NAME (lower case): {key: (variable, value)}}."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    for variable, value in environ.items():
        if not variable.upper().startswith(PROVIDERS_ENV_PREFIX) or value == "":
            continue
        parts = variable[len(PROVIDERS_ENV_PREFIX) :].split("__")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            continue  # e.g. CONNECTOR_PROVIDERS__CATALOG, a setting of the connector
        tables.setdefault(parts[0].lower(), {})[parts[1].lower()] = (variable, value)
    return tables


def _from_env_text(key: str, text: str) -> Any:
    """An environment value as the catalog key's type: true/false, a list (JSON or comma-separated), a JSON table."""
    field_info = ProviderTable.model_fields.get(key)
    default = field_info.get_default(call_default_factory=True) if field_info is not None else None
    text = text.strip()
    if isinstance(default, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError("must be true or false")
    if isinstance(default, list) or (field_info is not None and "list[" in str(field_info.annotation)):
        if text.startswith("["):
            return _json_value(text, "a JSON list of strings")
        return [part for part in text.replace(",", " ").split() if part]
    if isinstance(default, dict | BaseModel) or _is_table(field_info):
        return _json_value(text, 'a JSON object, e.g. {"prompt": "consent"}')
    return text


def _is_table(field_info: Any) -> bool:
    """Whether a catalog key is an optional sub-table (`legacy_token_exchange`): unset by default."""
    annotation = getattr(field_info, "annotation", None)
    return any(isinstance(arg, type) and issubclass(arg, BaseModel) for arg in getattr(annotation, "__args__", ()))


def _json_value(text: str, expected: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"must be {expected}") from None


@dataclass
class _Source:
    """Where one provider's keys came from, for errors: the file unless the environment set a key."""

    name: str
    file: str
    set_by: dict[str, str] = field(default_factory=dict)

    def error(self, key: str, problem: str) -> ConfigError:
        """A ConfigError about `key` (dotted below the provider), naming the file or the variable that set it."""
        variable = self.set_by.get(key.split(".")[0].split("[")[0])
        if variable is not None:
            return ConfigError(ENVIRONMENT, f"{self.name}.{key}", f"{problem} (set by {variable})")
        return ConfigError(self.file, f"{self.name}.{key}", problem)


def _check_table_shape(name: str, raw: Any, file: str, from_env: Mapping[str, tuple[str, str]]) -> None:
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            file, name, "provider names are lower-case letters, digits, '-' and '_', starting with a letter"
        )
    if not isinstance(raw, dict):
        raise ConfigError(file, name, f"expected a [{name}] table describing the provider")
    for secret_key in _SECRET_KEYS:
        if secret_key in raw or secret_key in from_env:
            origin = ENVIRONMENT if secret_key in from_env else file
            raise ConfigError(
                origin,
                f"{name}.{secret_key}",
                "client credentials are read only from "
                f"{provider_env_var(name, 'CLIENT_ID')} and {provider_env_var(name, 'CLIENT_SECRET')} "
                "(never from the catalog file, which is meant to be committed)",
            )


def _merged(
    raw: dict[str, Any], environ: Mapping[str, str], from_env: Mapping[str, tuple[str, str]], source: _Source
) -> dict[str, Any]:
    """The table with the environment applied: the older single-variable overrides, then
    `CONNECTOR_PROVIDERS__<NAME>__<KEY>` (which wins)."""
    merged = dict(raw)
    for key in ("discovery_url", "tenant"):
        variable = provider_env_var(source.name, key)
        if environ.get(variable, "").strip():
            merged[key], source.set_by[key] = environ[variable].strip(), variable
    for key, (variable, text) in from_env.items():
        source.set_by[key] = variable
        try:
            merged[key] = _from_env_text(key, text)
        except ValueError as exc:
            raise ConfigError(ENVIRONMENT, f"{source.name}.{key}", f"{exc} (set by {variable})") from None
    return {key: _blank_is_none(value) if key in _OPTIONAL_TEXT else value for key, value in merged.items()}


def _validated(merged: dict[str, Any], source: _Source) -> ProviderTable:
    try:
        return ProviderTable.model_validate(merged)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        problem = "unknown key" if error["type"] == "extra_forbidden" else error["msg"].removeprefix("Value error, ")
        raise source.error(dotted_key(tuple(error["loc"])), problem) from None


def _check_placeholders(key: str, url: str, quirks: Quirks, source: _Source) -> None:
    """Each `{name}` in an endpoint must be a per-connection value usable there."""
    allowed = {value.name for value in quirks.connection} | _CLIENT_PLACEHOLDERS.get(key, set())
    if key == "authorization_endpoint":  # sent before any value but the agent's is known
        allowed = {value.name for value in quirks.values_from("agent")}
    for name in placeholders(url):
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none declared"
            raise source.error(
                key,
                f"unknown placeholder {{{name}}} (usable here: {known}; declare a per-connection value in "
                f"[{source.name}.connection.{name}])",
            )


def _endpoint(key: str, written: str, tenant: str | None, quirks: Quirks, source: _Source) -> str:
    """An endpoint as stored: the catalog `{tenant}` filled (unless the agent gives it), placeholders checked,
    the URL checked with placeholders standing in."""
    url = written
    if key == "issuer":
        url = url.replace(TENANT_ID_PLACEHOLDER, "\0")  # kept: filled per ID token from its `tid` claim
    if tenant is not None:
        url = url.replace("{tenant}", tenant)
    _check_placeholders(key, url, quirks, source)
    if not url.startswith("{"):  # a URL that is a per-connection value ({instance_url}) is checked when known
        problem = url_problem(PLACEHOLDER.sub("placeholder", url).replace("\0", "tenantid"))
        if problem is not None:
            raise source.error(key, problem)
    return url.replace("\0", TENANT_ID_PLACEHOLDER)


def _tenant(table: ProviderTable, source: _Source) -> str:
    tenant = table.tenant or _DEFAULT_TENANT
    if not _TENANT_RE.fullmatch(tenant):
        raise source.error("tenant", "must be a tenant id or domain (letters, digits, '.', '-')")
    return tenant


def _quirks(table: ProviderTable, tenant: str, source: _Source) -> Quirks:
    quirks = table.quirks()
    for value in quirks.connection:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,31}", value.name):
            raise source.error(f"connection.{value.name}", "value names are lower-case letters, digits and '_'")
        needed = {"token_response": "pointer", "callback": "parameter"}.get(value.source)
        if needed is not None and getattr(value, needed) is None:
            raise source.error(f"connection.{value.name}.{needed}", f"is required with source = {value.source!r}")
        if value.secret and value.source == "agent":
            raise source.error(f"connection.{value.name}.secret", "a value the agent gives cannot be secret")
        try:
            re.compile(value.pattern)
        except re.error as exc:
            raise source.error(f"connection.{value.name}.pattern", f"not a regular expression: {exc}") from None
    tenant_value = quirks.value("tenant")
    if tenant_value is not None and tenant_value.source == "agent" and tenant_value.default is None:
        # The operator's tenant (the catalog's, or CONNECTOR_PROVIDER_<NAME>_TENANT) is the agent's default.
        connection = tuple(replace(v, default=tenant) if v is tenant_value else v for v in quirks.connection)
        quirks = replace(quirks, connection=connection)
    return quirks


def _fapi2(values: dict[str, Any], source: _Source) -> None:
    """`fapi2 = true`: PAR, PKCE S256, private_key_jwt, DPoP and RFC 9207 `iss` (FAPI 2.0 Security Profile §5), each
    turned on; a setting that contradicts one of them is refused, naming it."""
    if not values.get("pkce", True):
        raise source.error("pkce", "must be true for a FAPI 2.0 entry (fapi2 = true): PKCE S256 is required")
    method = values.get("token_endpoint_auth_method")
    if method not in (None, "private_key_jwt"):
        raise source.error(
            "token_endpoint_auth_method", "must be private_key_jwt for a FAPI 2.0 entry (fapi2 = true), or unset"
        )
    if not values.get("discovery_url") and not values.get("pushed_authorization_request_endpoint"):
        raise source.error(
            "pushed_authorization_request_endpoint", "is required for a FAPI 2.0 entry (fapi2 = true) without discovery"
        )
    values.update(
        token_endpoint_auth_method="private_key_jwt",  # noqa: S106 (a method name)
        pushed_authorization_requests=True,
        dpop=True,
        authorization_response_iss_parameter_supported=True,
    )


def _check_consistency(values: dict[str, Any], table: ProviderTable, source: _Source) -> None:
    if not values.get("discovery_url"):
        # Without discovery nothing can fill these in later: the checks they enable would silently not happen.
        if values["authorization_response_iss_parameter_supported"] and not values.get("issuer"):
            raise source.error("issuer", "is required when authorization_response_iss_parameter_supported is true")
        if values["oidc"] and values.get("authorization_endpoint"):
            for needed in ("issuer", "jwks_uri"):
                if not values.get(needed):
                    raise source.error(needed, "is required for an OpenID Connect provider (oidc = true)")
    if table.legacy_token_exchange is not None and table.refresh_tokens == "none":
        raise source.error(
            "legacy_token_exchange",
            'migrates a grant to an expiring token and a refresh token: refresh_tokens = "none" contradicts it',
        )
    for key in ("extra_authorize_params", "extra_token_params", "extra_refresh_params"):
        reserved = _RESERVED_PARAMS.intersection(getattr(table, key))
        if reserved:
            raise source.error(key, f"may not set {', '.join(sorted(reserved))}: the connector sets those itself")


def _credential(table: ProviderTable, raw: Mapping[str, Any], source: _Source) -> CredentialSpec | None:
    """A credential entry's fields, injection and check, checked together (None for an OAuth entry)."""
    if table.kind == "oauth":
        for key in sorted(CREDENTIAL_KEYS):
            if key in raw:
                raise source.error(key, 'belongs to a credential entry (kind = "api_key" or "basic")')
        return None
    for key in OAUTH_ONLY_KEYS:
        if raw.get(key):
            raise source.error(key, f"an entry of kind {table.kind!r} has no authorization server: remove it")
    if not table.api_base_url:
        raise source.error("api_base_url", f"is required for an entry of kind {table.kind!r}")
    try:
        return CredentialSpec(
            kind=table.kind,
            fields=table.fields,
            inject=tuple(table.inject),
            check=table.check,
            revoke_url=table.revoke_url,
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        problem = error["msg"].removeprefix("Value error, ")
        raise source.error(dotted_key(tuple(error["loc"])) or "kind", problem) from None


def _credentials(name: str, environ: Mapping[str, str]) -> tuple[str | None, SecretStr | None]:
    client_id = (environ.get(provider_env_var(name, "CLIENT_ID")) or "").strip() or None
    secret_text = (environ.get(provider_env_var(name, "CLIENT_SECRET")) or "").strip()
    return client_id, SecretStr(secret_text) if secret_text else None


def build_entry(
    name: str, raw: Any, environ: Mapping[str, str], file: str, from_env: Mapping[str, tuple[str, str]]
) -> ProviderEntry:
    """One catalog entry from its table, the environment's overrides and credentials (ConfigError if wrong)."""
    _check_table_shape(name, raw, file, from_env)
    source = _Source(name, file)
    table = _validated(_merged(raw, environ, from_env, source), source)
    tenant = _tenant(table, source)
    quirks = _quirks(table, tenant, source)
    filled_tenant = None if quirks.value("tenant") is not None else tenant
    credential = _credential(table, raw, source)
    values: dict[str, Any] = table.model_dump(exclude=set(QUIRK_KEYS) | set(CREDENTIAL_KEYS) | {"tenant"})
    for key in ENDPOINT_FIELDS:
        if values.get(key) is not None:
            values[key] = _endpoint(key, values[key], filled_tenant, quirks, source)
    if values.get("fapi2"):
        _fapi2(values, source)
    _check_consistency(values, table, source)
    if values.get("docs_url") and not re.fullmatch(r"https://[^\s]+", values["docs_url"]):
        raise source.error("docs_url", "must be an https URL")
    client_id, client_secret = _credentials(name, environ)
    values["default_scopes"] = tuple(values["default_scopes"])
    for resource in values.get("resource") or ():
        problem = url_problem(resource) if "#" not in resource else "has a fragment (RFC 8707 §2)"
        if problem is not None:
            raise source.error("resource", f"{resource!r} {problem}")
    return ProviderEntry(
        name=name, client_id=client_id, client_secret=client_secret, quirks=quirks, credential=credential, **values
    )


def load_catalog(path: Path, env: Mapping[str, str] | None = None) -> ProviderCatalog:
    """Read providers.toml, apply `CONNECTOR_PROVIDERS__<NAME>__<KEY>` and attach credentials from `env` (default
    os.environ). A NAME the file does not have adds a provider described by the environment alone.
    Raises ConfigError."""
    environ: Mapping[str, str] = os.environ if env is None else env
    file = str(path)
    data = _read_catalog_file(path)
    from_env = _env_tables(environ)
    by_env_name = {name.replace("-", "_"): name for name in data}
    environment_only = [name for name in from_env if name not in by_env_name]
    for name in environment_only:
        data[name] = {}
    entries = [
        build_entry(name, raw, environ, file, from_env.get(name.replace("-", "_"), {})) for name, raw in data.items()
    ]
    return ProviderCatalog(
        (replace(entry, environment_only=True) if entry.name in environment_only else entry for entry in entries),
        source=file,
    )
