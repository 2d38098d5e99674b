"""The protocol to providers, laid out by specification.

- `discovery` (OpenID Connect Discovery 1.0, RFC 8414) and `resolved` (`ResolvedProvider`: every endpoint known)
- `authorize` (RFC 6749 §4.1.1 with PKCE, RFC 7636; `state`; OpenID `nonce`; RFC 9207 `iss`)
- `token` (code exchange and refresh, RFC 6749 §4.1.3 and §6), `revocation` (RFC 7009)
- `id_token` (OpenID Connect Core 3.1.3.7, JWKS), `userinfo` (the provider account)
- `gateway`: `ProviderGateway`, the one object the rest of the connector talks to providers through.

The only package that talks to providers.
"""

from .discovery import DISCOVERY_FAILED
from .gateway import ProviderGateway
from .id_token import IdTokenError, JwksCache
from .resolved import ResolvedProvider

__all__ = ["DISCOVERY_FAILED", "IdTokenError", "JwksCache", "ProviderGateway", "ResolvedProvider"]
