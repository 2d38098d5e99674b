"""The protocol to providers, laid out by specification.

- `discovery` (OpenID Connect Discovery 1.0, RFC 8414) and `resolved` (`ResolvedProvider`: every endpoint known)
- `authorize` (RFC 6749 §4.1.1 with PKCE, RFC 7636; `state`; OpenID `nonce`; RFC 9207 `iss`; `offline_access`)
- `client_auth` (RFC 6749 §2.3: client_secret_basic form-encoded, client_secret_post, private_key_jwt, none),
  `client_keys` (our signing keys, from the vault: assertions and the public JWKS) and `endpoint`
  (an authenticated form POST and its errors)
- `token` (code exchange and refresh, RFC 6749 §4.1.3 and §6), `revocation` (RFC 7009)
- `id_token` (OpenID Connect Core 3.1.3.7 and 12.2, JWKS), `userinfo` (the provider account)
- `http`: one pooled HTTP client per provider
- `gateway`: `ProviderGateway`, the one object the rest of the connector talks to providers through.

The only package that talks to providers.
"""

from service.core.errors import DiscoveryError, EndpointError, IdTokenError

from .client_auth import AUTH_METHODS, AuthChoice, basic_credentials, choose_auth_method
from .client_keys import ClientKeys
from .discovery import DISCOVERY_FAILED
from .gateway import ProviderGateway
from .http import AnswerTooLarge, HttpSettings, ProviderHttp
from .id_token import IdTokenExpectations, JwksCache
from .resolved import ResolvedProvider

__all__ = [
    "AUTH_METHODS",
    "DISCOVERY_FAILED",
    "AnswerTooLarge",
    "AuthChoice",
    "ClientKeys",
    "DiscoveryError",
    "EndpointError",
    "HttpSettings",
    "IdTokenError",
    "IdTokenExpectations",
    "JwksCache",
    "ProviderGateway",
    "ProviderHttp",
    "ResolvedProvider",
    "basic_credentials",
    "choose_auth_method",
]
