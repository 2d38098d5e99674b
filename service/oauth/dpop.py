"""DPoP (RFC 9449): tokens bound to a key the connector holds, so a copied token is useless without it.

A key per grant (ES256), generated at the code exchange and kept, encrypted, with the grant's tokens (`TokenSet.
dpop_key`: the vault's AES-GCM, re-encrypted by `keys rotate` like every token); a proof per request (`typ`
`dpop+jwt`, the public key in the header; `htm`, `htu` without query and fragment, `iat`, a fresh `jti`, and `ath`
for a resource request); the provider's `DPoP-Nonce` learned per origin and a refused request retried once with it
(§8, §9). Used only where the entry asks for it (`dpop = true`, or the FAPI 2.0 profile): a provider that merely
advertises DPoP issues Bearer tokens to a client that sends no proof.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Mapping
from typing import Any

import httpx
from joserfc import jwt
from joserfc.jwk import ECKey

ALGORITHM = "ES256"
NONCE_ERROR = "use_dpop_nonce"
_MAX_NONCE = 512


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def htu(url: httpx.URL | str) -> str:
    """RFC 9449 §4.2: the request URI without query and fragment."""
    parsed = httpx.URL(str(url))
    return str(parsed.copy_with(query=None, fragment=None))


def origin(url: httpx.URL | str) -> str:
    parsed = httpx.URL(str(url))
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii')}"


class DpopKey:
    """One grant's DPoP key (a P-256 private key); never in a repr."""

    __slots__ = ("_key", "_public")

    def __init__(self, key: ECKey) -> None:
        self._key = key
        self._public = {k: v for k, v in key.as_dict(private=False).items() if k in ("kty", "crv", "x", "y")}

    @classmethod
    def generate(cls) -> DpopKey:
        return cls(ECKey.generate_key("P-256", private=True))

    @classmethod
    def from_jwk(cls, jwk: Mapping[str, Any]) -> DpopKey:
        return cls(ECKey.import_key(dict(jwk)))

    def private_jwk(self) -> dict[str, str]:
        """The private JWK, to be kept encrypted with the grant's tokens."""
        return {str(k): str(v) for k, v in self._key.as_dict(private=True).items()}

    @property
    def thumbprint(self) -> str:
        """RFC 7638 thumbprint (the `jkt` a provider binds tokens to)."""
        return str(self._key.thumbprint())

    def proof(
        self, method: str, url: httpx.URL | str, *, nonce: str | None = None, access_token: str | None = None
    ) -> str:
        claims: dict[str, Any] = {
            "htm": method.upper(),
            "htu": htu(url),
            "iat": int(time.time()),
            "jti": secrets.token_urlsafe(24),
        }
        if nonce is not None:
            claims["nonce"] = nonce
        if access_token is not None:
            claims["ath"] = _b64(hashlib.sha256(access_token.encode("ascii")).digest())
        header = {"typ": "dpop+jwt", "alg": ALGORITHM, "jwk": self._public}
        return jwt.encode(header, claims, self._key, algorithms=[ALGORITHM])

    def __repr__(self) -> str:
        return "DpopKey(<redacted>)"


class DpopNonces:
    """The last `DPoP-Nonce` each origin handed out (authorization and resource servers alike)."""

    def __init__(self) -> None:
        self._by_origin: dict[str, str] = {}

    def get(self, url: httpx.URL | str) -> str | None:
        return self._by_origin.get(origin(url))

    def learn(self, url: httpx.URL | str, response: httpx.Response) -> bool:
        """Remember the response's DPoP-Nonce for its origin; whether it carried one."""
        nonce = response.headers.get("dpop-nonce")
        if not nonce or len(nonce) > _MAX_NONCE or not nonce.isascii():
            return False
        if len(self._by_origin) > 1024:
            self._by_origin.clear()
        self._by_origin[origin(url)] = nonce
        return True


class Dpop:
    """What a request made with a DPoP key needs: the key and the nonces learned."""

    __slots__ = ("key", "nonces")

    def __init__(self, key: DpopKey, nonces: DpopNonces) -> None:
        self.key = key
        self.nonces = nonces

    def proof(self, method: str, url: httpx.URL | str, access_token: str | None = None) -> str:
        return self.key.proof(method, url, nonce=self.nonces.get(url), access_token=access_token)

    def asks_for_nonce(self, url: httpx.URL | str, response: httpx.Response, body: Any = None) -> bool:
        """Whether `response` refuses for want of a (new) nonce, and brought one (§8: token endpoint, 400 with
        error use_dpop_nonce; §9: resource server, 401 with WWW-Authenticate error="use_dpop_nonce")."""
        learned = self.nonces.learn(url, response)
        if not learned:
            return False
        if isinstance(body, Mapping) and body.get("error") == NONCE_ERROR:
            return True
        return response.status_code == 401 and NONCE_ERROR in response.headers.get("www-authenticate", "")

    def __repr__(self) -> str:
        return "Dpop(<redacted>)"
