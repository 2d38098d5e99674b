"""The example's side of MCP's own authorization on streamable HTTP: a `TokenVerifier` for JWT access tokens.

The MCP server is a resource server: an authorization server of your choice issues JWT access tokens (RFC 9068) for
it, signed with a key in its JWKS. A token counts only when its signature, `iss`, `aud` (this server's URL), `exp`
and `sub` check out; its `(iss, sub)` is then the user the connector binds the elicitation to, and the connect page
checks that the person in the browser is that user. `dev-token` makes a local key, its JWKS file and a token, for
trying it out without an authorization server.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, RSAKey
from joserfc.jwt import JWTClaimsRegistry
from mcp.server.auth.provider import AccessToken, TokenVerifier


class JwtVerifier(TokenVerifier):
    """Accepts RS256/ES256 JWT access tokens from `issuer`, for `audience`, signed by a key in `jwks` (a URL or a
    file)."""

    def __init__(self, issuer: str, audience: str, jwks: str) -> None:
        self.issuer = issuer
        self.audience = audience
        self.jwks = jwks
        self._keys: KeySet | None = None

    async def _key_set(self) -> KeySet:
        if self._keys is None:
            if self.jwks.startswith(("http://", "https://")):
                async with httpx.AsyncClient(timeout=10) as client:
                    answer = await client.get(self.jwks)
                    answer.raise_for_status()
                    document = answer.json()
            else:
                document = json.loads(await anyio.Path(self.jwks).read_text())
            self._keys = KeySet.import_key_set(document)
        return self._keys

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            decoded = jwt.decode(token, await self._key_set(), algorithms=["RS256", "ES256"])
            JWTClaimsRegistry(
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.audience},
                sub={"essential": True},
                exp={"essential": True},
            ).validate(decoded.claims)
        except (JoseError, ValueError):
            return None
        claims: dict[str, Any] = decoded.claims
        scopes = str(claims.get("scope", "")).split()
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "")),
            scopes=scopes,
            expires_at=int(claims["exp"]),
            resource=self.audience,
            subject=str(claims["sub"]),
            claims={"iss": claims["iss"]},
        )


def dev_token(jwks_file: Path, *, issuer: str, audience: str, subject: str, seconds: int = 3600) -> str:
    """A token for `subject` signed with the key in `jwks_file`'s private twin (made, with the JWKS, if missing)."""
    private_file = jwks_file.with_suffix(".private.json")
    if private_file.exists():
        key = RSAKey.import_key(json.loads(private_file.read_text()))
    else:
        key = RSAKey.generate_key(2048, parameters={"kid": "dev-1", "use": "sig", "alg": "RS256"})
        jwks_file.parent.mkdir(parents=True, exist_ok=True)
        private_file.touch(mode=0o600)
        private_file.write_text(json.dumps(key.as_dict(private=True)))
        jwks_file.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    now = int(time.time())
    claims = {"iss": issuer, "aud": audience, "sub": subject, "iat": now, "exp": now + seconds, "client_id": "dev"}
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)
