"""The connector's own signing keys as a client: `private_key_jwt` assertions (RFC 7523 §2.2, OpenID Connect Core
§9) and the public JWKS a provider verifies them with.

The keys are derived from the vault's ring (`Vault.signing_keys`), so every replica signs with the same key and a
vault key rotation rotates them with overlap: the JWKS lists the public key of every key in the ring (the active
one signs), until the old vault key is retired. An assertion carries a fresh `jti`, `iss` = `sub` = our client id,
`aud` the provider's issuer (or its token endpoint where the entry says so) and expires within a minute.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt
from joserfc.jwk import ECKey

PURPOSE = "client-assertion"
ALGORITHM = "ES256"
ASSERTION_LIFETIME = 60  # seconds
JWKS_PATH = "/.well-known/jwks.json"  # where the connector serves `ClientKeys.jwks()` (web/jwks.py)
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class KeySource(Protocol):
    """What holds the key material (the vault): P-256 keys for a purpose, the active one first."""

    def signing_keys(self, purpose: str) -> list[tuple[str, ec.EllipticCurvePrivateKey]]: ...


class ClientKeys:
    """Signs client assertions with the active key; publishes every key's public half."""

    __slots__ = ("_cache", "_clock", "_source")

    def __init__(self, source: KeySource, *, clock: Callable[[], float] = time.time) -> None:
        self._source = source
        self._clock = clock
        self._cache: dict[str, tuple[str, ECKey]] = {}  # vault key id -> (kid, key)

    def _keys(self) -> list[tuple[str, ECKey]]:
        keys = []
        for key_id, private in self._source.signing_keys(PURPOSE):
            cached = self._cache.get(key_id)
            if cached is None:
                key = ECKey.import_key(private)
                cached = self._cache[key_id] = (key.thumbprint(), key)  # RFC 7638: the kid names the key itself
            keys.append(cached)
        return keys

    @property
    def active_kid(self) -> str:
        return self._keys()[0][0]

    def jwks(self) -> dict[str, Any]:
        """The public JWKS (RFC 7517): one ES256 signing key per vault key, the active one first."""
        return {
            "keys": [
                {**key.as_dict(private=False), "kid": kid, "use": "sig", "alg": ALGORITHM} for kid, key in self._keys()
            ]
        }

    def assertion(self, client_id: str, audience: str) -> str:
        """A `private_key_jwt` client assertion for one request (never logged, never stored)."""
        kid, key = self._keys()[0]
        now = int(self._clock())
        claims = {
            "iss": client_id,
            "sub": client_id,
            "aud": audience,
            "jti": secrets.token_urlsafe(24),
            "iat": now,
            "exp": now + ASSERTION_LIFETIME,
        }
        return jwt.encode({"alg": ALGORITHM, "kid": kid, "typ": "JWT"}, claims, key, algorithms=[ALGORITHM])

    def __repr__(self) -> str:
        return "ClientKeys(<in the vault>)"
