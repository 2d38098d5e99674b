"""A mock OpenID Connect provider: the mock OAuth provider plus signed ID tokens, a JWKS and discovery.

ID tokens are signed with a real RSA key (joserfc) whose public half is served at `/jwks`; the token's
`nonce` is the one the authorization request carried. Tests spoil one thing at a time through
`id_token_claims` (claims to replace, `None` removes one), `id_token_header`, `id_token_signer` (a key the
JWKS does not hold) and `id_token_forge` (build the token yourself, e.g. `alg: none`); `discovery_overrides`
spoils the discovery document the same way. With `id_token_on_refresh` (on in `strict()`) a refresh answers with
an ID token too (the original nonce, as OpenID Connect Core §12.2 allows), whose `sub` is
`refresh_sub_override` once when that is set. Serve it over real HTTP with `serve_http()` (the JWKS is then
fetched over a socket), or through respx with `install()`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlencode

from joserfc import jwt
from joserfc.jwk import RSAKey

from .mock_provider import MockOAuthProvider, MockRequest, MockResponse


def _signing_key(kid: str = "mock-key-1") -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"})


@dataclass
class MockOIDCProvider(MockOAuthProvider):
    base_url: str = "https://oidc.mock-provider.test"
    account: dict[str, Any] = field(
        default_factory=lambda: {"sub": "oidc-user-1", "email": "mona@example.com", "name": "Mona"}
    )
    comma_scopes: bool = False
    issuer_override: str | None = None  # the `iss` it claims; default: base_url
    iss_in_authorization_response: bool = False  # RFC 9207: add `iss` to the redirect back to the client
    signing_key: RSAKey = field(default_factory=_signing_key)
    id_token_claims: dict[str, Any] = field(default_factory=dict)  # replace claims; None removes one
    id_token_header: dict[str, Any] = field(default_factory=dict)
    id_token_signer: RSAKey | None = None  # sign with another key than the published one
    id_token_forge: Callable[[dict[str, Any]], str] | None = None  # build the token from the claims yourself
    id_token_lifetime: int = 300
    id_token_on_refresh: bool = False  # a refresh answers with an ID token too
    refresh_sub_override: str | None = None  # the next refresh's ID token names this `sub` (once)
    discovery_overrides: dict[str, Any] = field(default_factory=dict)  # replace members; None removes one
    discovery_answer: MockResponse | None = None  # answer the discovery request with this instead (e.g. not JSON)
    issued_id_tokens: list[str] = field(default_factory=list)
    jwks_requests: int = 0

    STRICT: ClassVar[dict[str, Any]] = {**MockOAuthProvider.STRICT, "id_token_on_refresh": True}

    @property
    def issuer(self) -> str:
        return self.issuer_override or self.base_url

    def catalog_entry(self) -> dict[str, Any]:
        """A providers.toml table with endpoints written out (as for Google)."""
        return {
            **super().catalog_entry(),
            "display_name": "Mock OpenID Provider",
            "oidc": True,
            "issuer": self.issuer,
            "jwks_uri": f"{self.base_url}/jwks",
            "account_id_field": "sub",
            "default_scopes": ["email"],
        }

    def discovery_entry(self) -> dict[str, Any]:
        """A providers.toml table that reads everything from the discovery document (as the generic `oidc`)."""
        return {
            "display_name": "Mock OpenID Provider",
            "oidc": True,
            "discovery_url": f"{self.base_url}/.well-known/openid-configuration",
            "account_id_field": "sub",
            "default_scopes": ["email"],
            "api_base_url": f"{self.base_url}/api",
        }

    def secrets_issued(self) -> list[str]:
        return [*super().secrets_issued(), *self.issued_id_tokens]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self.signing_key.as_dict(private=False)]}

    # -- endpoints ---------------------------------------------------------------------------------------
    def _routes(self) -> dict[tuple[str, str], Any]:
        return {
            **super()._routes(),
            ("GET", "/jwks"): self._jwks,
            ("GET", "/.well-known/openid-configuration"): self._discovery,
        }

    def _jwks(self, request: MockRequest) -> MockResponse:
        self.jwks_requests += 1
        return MockResponse.json(200, self.jwks())

    def _discovery(self, request: MockRequest) -> MockResponse:
        if self.discovery_answer is not None:
            return self.discovery_answer
        methods = ["client_secret_basic", "client_secret_post"]
        document = {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.base_url}/authorize",
            "token_endpoint": f"{self.base_url}/token",
            "userinfo_endpoint": f"{self.base_url}/api/user",
            "revocation_endpoint": f"{self.base_url}/revoke",
            "jwks_uri": f"{self.base_url}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": methods,
            "scopes_supported": ["openid", "offline_access", "email", "profile"],
            "code_challenge_methods_supported": ["S256"],
            "authorization_response_iss_parameter_supported": self.iss_in_authorization_response,
        }
        for name, value in self.discovery_overrides.items():
            if value is None:
                document.pop(name, None)
            else:
                document[name] = value
        return MockResponse.json(200, document)

    def _authorize(self, request: MockRequest) -> MockResponse:
        return self._with_issuer(super()._authorize(request))

    def _signed_in(self, request: MockRequest) -> MockResponse:
        return self._with_issuer(super()._signed_in(request))

    def _with_issuer(self, answer: MockResponse) -> MockResponse:
        """A redirect to the client with `iss` (RFC 9207), when `iss_in_authorization_response`."""
        location = answer.headers.get("location")
        if location is None:
            return answer
        if self.iss_in_authorization_response:
            sep = "&" if "?" in location else "?"
            answer = MockResponse(answer.status, {"location": f"{location}{sep}{urlencode({'iss': self.issuer})}"})
        return answer

    def _token(self, request: MockRequest) -> MockResponse:
        grant_type = request.params().get("grant_type")
        answer = super()._token(request)
        if answer.status != 200 or (grant_type == "refresh_token" and not self.id_token_on_refresh):
            return answer
        body = json.loads(answer.body)
        grant = self._grants[body["access_token"]]
        subject = None
        if grant_type == "refresh_token":
            subject, self.refresh_sub_override = self.refresh_sub_override, None
        body["id_token"] = self.make_id_token(nonce=grant.nonce, subject=subject, account=grant.account)
        return MockResponse.json(200, body)

    def make_id_token(
        self, *, nonce: str | None, subject: str | None = None, account: dict[str, Any] | None = None
    ) -> str:
        """An ID token for `account` (the one the grant was given as; default: whoever is signed in now)."""
        now = int(time.time())
        who = account or self.account
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject or str(who["sub"]),
            "aud": self.client_id,
            "exp": now + self.id_token_lifetime,
            "iat": now,
            "email": who.get("email"),
        }
        if nonce is not None:
            claims["nonce"] = nonce
        for name, value in self.id_token_claims.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        if self.id_token_forge is not None:
            token = self.id_token_forge(claims)
        else:
            key = self.id_token_signer or self.signing_key
            header = {"alg": "RS256", "kid": key.kid, **self.id_token_header}
            token = jwt.encode(header, claims, key)
        self.issued_id_tokens.append(token)
        return token


__all__ = ["MockOIDCProvider"]
