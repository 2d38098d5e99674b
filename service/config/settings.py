"""`Settings`: the root of the configuration, its sections together, and the sources it is read from.

Precedence is environment > TOML file > defaults. `service.config.loader.load_settings` builds it; a plain
`Settings()` reads os.environ and no file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from service.core.errors import ConfigError
from service.core.settings import FlowSettings
from service.core.urls import is_loopback_host, url_problem
from service.util.docstrings import attribute_docstrings

from .origins import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ENVIRONMENT,
    config_error_at,
    env_var_for,
    setting_env_var,
    unknown_key_problem,
)
from .sections import (
    AdminSettings,
    ApiSettings,
    DatabaseSettings,
    ElicitationSettings,
    EventsSettings,
    GrantSettings,
    IdentitySettings,
    MetricsSettings,
    ProvidersSettings,
    RateLimitSettings,
    ReplicaSettings,
    RetentionSettings,
    ServerSettings,
    TenantSettings,
    VaultSettings,
    WebhookSettings,
)

__all__ = ["Settings", "keys_at", "problem_of", "reading", "setting_field", "setting_paths"]

log = logging.getLogger("service.config")

# The loader hands the TOML file and the environment to `Settings.settings_customise_sources` through these,
# so that a plain `Settings()` still works (os.environ, no file) and concurrent loads do not interfere.
_toml_file: ContextVar[Path | None] = ContextVar("connector_toml_file", default=None)
_environ: ContextVar[Mapping[str, str] | None] = ContextVar("connector_environ", default=None)


def connector_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The non-empty CONNECTOR_* variables of `environ`."""
    return {key: value for key, value in environ.items() if value != "" and key.upper().startswith(ENV_PREFIX)}


class Settings(BaseSettings):
    """All settings of one connector. Build it with `load_settings`; it is immutable once built."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        env_ignore_empty=True,
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    public_base_url: str = "http://127.0.0.1:8700"
    """The URL at which browsers reach this service: links and the OAuth redirect URIs are built from it. https
    unless the host is loopback; no query or fragment. Unset, it follows the listener: http://<server.host>:
    <server.port> when server.host is loopback, else http://127.0.0.1:<server.port>."""
    agent_name: str = Field(default="ACP agent", min_length=1)
    """The agent's name as the user sees it on the consent page."""
    log_format: Literal["text", "json"] = "text"
    """Log line format: text for people, json for log collectors (one object per line). --log-format overrides it."""
    demo: bool = False
    """Development demo (`acp-connector serve --demo`, `make run`): / offers a link that starts an authorization for
    the local verifier's user without an agent. Loopback deployments with the local verifier only."""
    server: ServerSettings = Field(default_factory=ServerSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    elicitation: ElicitationSettings = Field(default_factory=ElicitationSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    vault: VaultSettings = Field(default_factory=VaultSettings)
    providers: ProvidersSettings = Field(default_factory=ProvidersSettings)
    rate_limit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    replicas: ReplicaSettings = Field(default_factory=ReplicaSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    grants: GrantSettings = Field(default_factory=GrantSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    tenants: TenantSettings = Field(default_factory=TenantSettings)
    config_file: Path | None = None

    @field_validator("public_base_url")
    @classmethod
    def _check_public_base_url(cls, value: str) -> str:
        value = value.strip()
        problem = url_problem(value, allow_query=False)
        if problem is not None:
            raise ValueError(problem)
        return value.rstrip("/")

    @model_validator(mode="after")
    def _demo_only_where_nobody_else_reaches_it(self) -> Settings:
        if "public_base_url" not in self.model_fields_set:  # unset: the URL of the listener (frozen: set once here)
            object.__setattr__(self, "public_base_url", self.listener_url())
        problem = self.demo_problem()
        if problem is not None:
            detail = InitErrorDetails(
                type=PydanticCustomError("demo_refused", "{problem}", {"problem": problem}), loc=("demo",), input=True
            )
            raise ValidationError.from_exception_data(type(self).__name__, [detail])
        return self

    # The CONNECTOR_* variables the loader read (names and values; never in a repr). Provider credentials come
    # from here too, so `load_settings(env=...)` governs everything.
    _env: dict[str, str] = PrivateAttr(default_factory=lambda: connector_environment(os.environ))

    _warned: set[tuple[str, str]] = PrivateAttr(default_factory=set)

    def environment(self) -> Mapping[str, str]:
        """The CONNECTOR_* environment these settings were loaded with."""
        return dict(self._env)

    def origin(self, loc: tuple[str, ...]) -> str:
        """Where the setting at `loc` came from: the CONNECTOR_* variable that set it, else the file."""
        env_var = env_var_for(loc, self._env)
        if env_var is not None:
            return env_var
        nested = setting_env_var(loc) + ENV_NESTED_DELIMITER  # a table set key by key from the environment
        setters = sorted(name for name in self._env if name.upper().startswith(nested))
        if setters:
            return setters[0]
        return str(self.config_file) if self.config_file is not None else ENVIRONMENT

    def config_error(self, loc: tuple[str, ...], problem: str) -> ConfigError:
        """A ConfigError about the setting at `loc`, naming the environment variable or the file that set it."""
        return config_error_at(loc, problem, self.config_file, self._env)

    def section_error(
        self, prefix: tuple[str, ...], exc: ValidationError, model: type[BaseModel] | None = None
    ) -> ConfigError:
        """A ConfigError for the first problem pydantic found in the section at `prefix` (validated by `model`,
        whose fields an unknown key is compared with)."""
        error = exc.errors(include_url=False, include_input=False)[0]
        loc = (*prefix, *(str(part) for part in error["loc"]))
        valid = list(model.model_fields) if model is not None and len(error["loc"]) == 1 else []
        return self.config_error(loc, problem_of(error, valid))

    def warn(self, key: str, message: str) -> None:
        """Log a configuration warning about `key` on `service.config`, once for these settings (and copies)."""
        if (key, message) in self._warned:
            return
        self._warned.add((key, message))
        log.warning(message, extra={"config_key": key})

    def listener_url(self) -> str:
        """The http URL of the listener as seen from this machine (a loopback server.host, else 127.0.0.1)."""
        host = self.server.host if is_loopback_host(self.server.host) else "127.0.0.1"
        return f"http://{f'[{host}]' if ':' in host else host}:{self.server.port}"

    def public_url_disagreement(self) -> str | None:
        """Why a public_base_url that was set does not reach the listener, when both are on loopback, or None."""
        if "public_base_url" not in self.model_fields_set or not self.is_loopback_deployment:
            return None
        public = urlsplit(self.public_base_url)
        public_port = public.port or (443 if public.scheme == "https" else 80)
        if public_port == self.server.port:
            return None
        return (
            f"public_base_url ({self.public_base_url}, set by {self.origin(('public_base_url',))}) names port "
            f"{public_port}, but the server listens on {self.server.host}:{self.server.port}: links and redirect URIs "
            "would lead elsewhere. Remove public_base_url to follow the listener, or make the two agree"
        )

    @property
    def public_host(self) -> str:
        """Host name of `public_base_url`."""
        return urlsplit(self.public_base_url).hostname or ""

    @property
    def is_loopback_deployment(self) -> bool:
        """True when both the listening address and the public URL are loopback: a single-machine setup."""
        return is_loopback_host(self.server.host) and is_loopback_host(self.public_host)

    def demo_problem(self) -> str | None:
        """Why `demo` cannot be on with these settings, or None (settings with such a problem are never built)."""
        if not self.demo:
            return None
        if not self.is_loopback_deployment:
            return (
                "the demo starts authorizations without an agent, so it runs on a loopback deployment only "
                f"(server.host is '{self.server.host}', public_base_url's host is '{self.public_host}')"
            )
        if self.identity.verifier != "local":
            return f"the demo acts for the local verifier's user, but identity.verifier is '{self.identity.verifier}'"
        return None

    def flow(self) -> FlowSettings:
        """What the elicitation lifecycle and the browser flow need, as plain values."""
        return FlowSettings(
            public_base_url=self.public_base_url,
            agent_name=self.agent_name,
            elicitation_ttl=timedelta(seconds=self.elicitation.ttl_seconds),
            max_mismatches=self.identity.max_mismatches,
            verifier_name=self.identity.verifier,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _environ.get()
        env_source = env_settings if environ is None else _MappingEnvSource(settings_cls, environ)
        toml_file = _toml_file.get()
        if toml_file is None:
            return init_settings, env_source
        return init_settings, env_source, TomlConfigSettingsSource(settings_cls, toml_file=toml_file)


class _MappingEnvSource(EnvSettingsSource):
    """The environment source, reading a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._given_environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._given_environ.items() if value != ""}


@contextmanager
def reading(toml_file: Path | None, environ: Mapping[str, str]) -> Iterator[None]:
    """While inside, `Settings()` reads `toml_file` (if any) and `environ` instead of os.environ."""
    file_token = _toml_file.set(toml_file)
    env_token = _environ.set(environ)
    try:
        yield
    finally:
        _toml_file.reset(file_token)
        _environ.reset(env_token)


def setting_paths(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting as its path of keys, e.g. `("server", "port")`, in declaration order.

    The `[identity.<name>]` tables are not included: each verifier plugin declares its own (`settings_model`).
    """
    paths: list[tuple[str, ...]] = []
    for name, field in (model or Settings).model_fields.items():
        if name == "config_file":
            continue
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths.extend(setting_paths(annotation, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


def _section_of(path: Sequence[str]) -> type[BaseModel]:
    model: type[BaseModel] = Settings
    for part in path[:-1]:
        annotation = model.model_fields[part].annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation
    return model


def setting_field(path: Sequence[str]) -> FieldInfo:
    """The pydantic field of a setting path (for its type and default)."""
    return _section_of(path).model_fields[path[-1]]


def setting_description(path: Sequence[str]) -> str:
    """What a setting means: its field's docstring in the source."""
    return field_description(_section_of(path), path[-1])


def field_description(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].description or attribute_docstrings(model).get(name, "")


def keys_at(loc: Sequence[str | int]) -> list[str]:
    """The valid keys of the section at `loc` (the top level for `()`), empty when `loc` is not a section."""
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return [name for name in model.model_fields if name != "config_file"]


def problem_of(error: ErrorDetails, valid: Sequence[str] | None = None) -> str:
    """The sentence for one pydantic error; an unknown key is compared with `valid` (default: its section's keys)."""
    if error["type"] == "extra_forbidden":
        loc = tuple(error["loc"])
        candidates = valid if valid is not None else keys_at(loc[:-1])
        return unknown_key_problem(str(loc[-1]), candidates if loc else ())
    return error["msg"].removeprefix("Value error, ")
