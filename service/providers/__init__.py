"""The provider catalog: one `ProviderEntry` per OAuth provider, from providers.toml plus env credentials.

Endpoints come from the catalog file (or, for generic OIDC entries, from the provider's discovery document, which
`service.oauth` fetches); how each provider departs from plain OAuth 2.0 is data too (`quirks`). This package
never talks to a provider.
- `entry`: `ProviderEntry`, `ProviderCatalog`, the credential variables
- `quirks`: token response shape, token request, revocation style, API auth, per-connection values
- `table`: a providers.toml table as written (pydantic); `loading`: file + environment -> catalog
"""

from .entry import (
    ENDPOINT_FIELDS,
    PROVIDER_ENV_SUFFIXES,
    TENANT_ID_PLACEHOLDER,
    ProviderCatalog,
    ProviderEntry,
    TokenEndpointAuthMethod,
    provider_env_var,
)
from .loading import load_catalog, provider_setting_env_var, provider_setting_env_vars
from .quirks import ApiAuth, ConnectionValue, Quirks, Revocation, TokenRequest, TokenResponseShape, resolve_pointer

__all__ = [
    "ENDPOINT_FIELDS",
    "PROVIDER_ENV_SUFFIXES",
    "TENANT_ID_PLACEHOLDER",
    "ApiAuth",
    "ConnectionValue",
    "ProviderCatalog",
    "ProviderEntry",
    "Quirks",
    "Revocation",
    "TokenEndpointAuthMethod",
    "TokenRequest",
    "TokenResponseShape",
    "load_catalog",
    "provider_env_var",
    "provider_setting_env_var",
    "provider_setting_env_vars",
    "resolve_pointer",
]
