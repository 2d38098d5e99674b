"""The connector's configuration: a TOML file and CONNECTOR_* environment variables, read into `Settings`.

The package keeps options as oauth2-proxy does, one file a job:
  `sections`  the `[server]`, `[database]`, ... sections: keys, defaults, checks, and each one's plain-value view
  `settings`  `Settings`, the root that holds the sections, and the sources it reads
  `loader`    `load_settings`, the one entry point that reads files
  `origins`   where a value came from (the file, or "environment" and the variable), and the `ConfigError` naming it
  `values`    how a value may be written (blank is unset, a comma-separated list)
"""

from __future__ import annotations

from .loader import DEFAULT_CONFIG_PATH, load_settings
from .origins import (
    CONFIG_ENV_VAR,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    ENVIRONMENT,
    config_error_at,
    nearest,
    setting_env_var,
    unknown_key_problem,
)
from .sections import (
    DATABASE_SCHEMES,
    RATE_LIMIT_STORAGES,
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
from .settings import Settings, field_description, setting_description, setting_field, setting_paths
from .values import optional_secret, optional_str, split_list

__all__ = [
    "CONFIG_ENV_VAR",
    "DATABASE_SCHEMES",
    "DEFAULT_CONFIG_PATH",
    "ENVIRONMENT",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "RATE_LIMIT_STORAGES",
    "AdminSettings",
    "ApiSettings",
    "DatabaseSettings",
    "ElicitationSettings",
    "EventsSettings",
    "GrantSettings",
    "IdentitySettings",
    "MetricsSettings",
    "ProvidersSettings",
    "RateLimitSettings",
    "ReplicaSettings",
    "RetentionSettings",
    "ServerSettings",
    "Settings",
    "TenantSettings",
    "VaultSettings",
    "WebhookSettings",
    "config_error_at",
    "field_description",
    "load_settings",
    "nearest",
    "optional_secret",
    "optional_str",
    "setting_description",
    "setting_env_var",
    "setting_field",
    "setting_paths",
    "split_list",
    "unknown_key_problem",
]
