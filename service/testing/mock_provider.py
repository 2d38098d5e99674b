"""A mock OAuth 2.0 provider served through respx: it really checks client auth, redirect URI, PKCE and codes.

Use it to test an agent end to end without a network: it plays GitHub-like authorize, token,
userinfo, revocation and a small API (`/api/user`, `/api/user/repos`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import respx


@dataclass
class _IssuedCode:
    client_id: str
    redirect_uri: str
    scope: str
    code_challenge: str | None
    used: bool = False


@dataclass
class MockOAuthProvider:
    """A provider at `base_url` that issues real-looking, random tokens and validates every step."""

    base_url: str = "https://oauth.mock-provider.test"
    client_id: str = "mock-client-id"
    client_secret: str = field(default_factory=lambda: "mock_secret_" + secrets.token_urlsafe(16))
    account: dict[str, Any] = field(default_factory=lambda: {"id": 4242, "login": "octocat", "name": "Mona"})
    repos: list[dict[str, Any]] = field(
        default_factory=lambda: [{"id": 1, "full_name": "octocat/hello-world", "private": False}]
    )
    require_pkce: bool = True
    expires_in: int | None = 3600
    issue_refresh_token: bool = True
    comma_scopes: bool = True  # answer `scope` GitHub-style, comma-separated
    deny_next: str | None = None  # e.g. "access_denied": the next authorize answers with this error
    issued_access_tokens: list[str] = field(default_factory=list)
    issued_refresh_tokens: list[str] = field(default_factory=list)
    issued_codes: list[str] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    api_calls: list[str] = field(default_factory=list)
    _codes: dict[str, _IssuedCode] = field(default_factory=dict)
    _access: set[str] = field(default_factory=set)
    _refresh: set[str] = field(default_factory=set)

    # -- configuration a catalog needs ---------------------------------------------------------------
    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    def catalog_entry(self) -> dict[str, Any]:
        """The provider's table for a providers.toml (credentials go in the environment)."""
        return {
            "display_name": "Mock Provider",
            "authorization_endpoint": f"{self.base_url}/authorize",
            "token_endpoint": f"{self.base_url}/token",
            "revocation_endpoint": f"{self.base_url}/revoke",
            "userinfo_endpoint": f"{self.base_url}/api/user",
            "api_base_url": f"{self.base_url}/api",
            "default_scopes": ["read:user"],
            "account_id_field": "id",
        }

    def secrets_issued(self) -> list[str]:
        """Every secret this provider handed out or holds: for scanning logs and messages."""
        return [
            self.client_secret,
            *self.issued_access_tokens,
            *self.issued_refresh_tokens,
            *self.issued_codes,
        ]

    # -- wiring ----------------------------------------------------------------------------------------
    def install(self, router: respx.MockRouter) -> None:
        router.get(f"{self.base_url}/authorize").mock(side_effect=self._authorize)
        router.post(f"{self.base_url}/token").mock(side_effect=self._token)
        router.post(f"{self.base_url}/revoke").mock(side_effect=self._revoke)
        router.get(f"{self.base_url}/api/user").mock(side_effect=self._user)
        router.get(f"{self.base_url}/api/user/repos").mock(side_effect=self._repos)

    # -- endpoints -------------------------------------------------------------------------------------
    def _authorize(self, request: httpx.Request) -> httpx.Response:
        q = {k: v[0] for k, v in parse_qs(request.url.query.decode()).items()}
        redirect_uri = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id or not redirect_uri:
            return httpx.Response(400, text="unknown client or missing redirect_uri")
        if q.get("response_type") != "code":
            return _redirect(redirect_uri, error="unsupported_response_type", state=q.get("state"))
        if self.deny_next is not None:
            error, self.deny_next = self.deny_next, None
            return _redirect(redirect_uri, error=error, state=q.get("state"))
        challenge = q.get("code_challenge")
        if self.require_pkce and (challenge is None or q.get("code_challenge_method") != "S256"):
            return _redirect(redirect_uri, error="invalid_request", state=q.get("state"))
        code = "mock_code_" + secrets.token_urlsafe(24)
        self.issued_codes.append(code)
        self._codes[code] = _IssuedCode(self.client_id, redirect_uri, q.get("scope", ""), challenge)
        return _redirect(redirect_uri, code=code, state=q.get("state"))

    def _client_authenticated(self, request: httpx.Request, form: dict[str, str]) -> bool:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            decoded = base64.b64decode(header[6:]).decode()
            cid, _, secret = decoded.partition(":")
            return cid == self.client_id and secret == self.client_secret
        return form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret

    def _token(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        self.token_requests.append({k: v for k, v in form.items() if k == "grant_type"})
        if not self._client_authenticated(request, form):
            return _json(401, {"error": "invalid_client"})
        grant_type = form.get("grant_type")
        if grant_type == "authorization_code":
            issued = self._codes.get(form.get("code", ""))
            if issued is None or issued.used:
                return _json(400, {"error": "invalid_grant", "error_description": "bad or used code"})
            issued.used = True
            if form.get("redirect_uri") != issued.redirect_uri:
                return _json(400, {"error": "invalid_grant", "error_description": "redirect_uri mismatch"})
            if issued.code_challenge is not None:
                verifier = form.get("code_verifier", "")
                if _s256(verifier) != issued.code_challenge:
                    return _json(400, {"error": "invalid_grant", "error_description": "PKCE check failed"})
            return _json(200, self._issue(issued.scope))
        if grant_type == "refresh_token":
            old = form.get("refresh_token", "")
            if old not in self._refresh:
                return _json(400, {"error": "invalid_grant", "error_description": "bad refresh token"})
            self._refresh.discard(old)  # rotation: the old refresh token dies
            return _json(200, self._issue(None))
        return _json(400, {"error": "unsupported_grant_type"})

    def _issue(self, scope: str | None) -> dict[str, Any]:
        access = "mock_at_" + secrets.token_urlsafe(24)
        self.issued_access_tokens.append(access)
        self._access.add(access)
        body: dict[str, Any] = {"access_token": access, "token_type": "bearer"}
        if scope is not None:
            body["scope"] = ",".join(scope.split()) if self.comma_scopes else scope
        if self.expires_in is not None:
            body["expires_in"] = self.expires_in
        if self.issue_refresh_token:
            refresh = "mock_rt_" + secrets.token_urlsafe(24)
            self.issued_refresh_tokens.append(refresh)
            self._refresh.add(refresh)
            body["refresh_token"] = refresh
        return body

    def _revoke(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        if not self._client_authenticated(request, form):
            return _json(401, {"error": "invalid_client"})
        token = form.get("token", "")
        self._access.discard(token)
        self._refresh.discard(token)
        return httpx.Response(200)

    def _bearer_ok(self, request: httpx.Request) -> bool:
        header = request.headers.get("authorization", "")
        return header.lower().startswith("bearer ") and header[7:] in self._access

    def _user(self, request: httpx.Request) -> httpx.Response:
        self.api_calls.append(request.url.path)
        if not self._bearer_ok(request):
            return _json(401, {"message": "Bad credentials"})
        return _json(200, self.account)

    def _repos(self, request: httpx.Request) -> httpx.Response:
        self.api_calls.append(request.url.path)
        if not self._bearer_ok(request):
            return _json(401, {"message": "Bad credentials"})
        return _json(200, self.repos)

    def expire_access_tokens(self) -> None:
        """Make every issued access token invalid, as if they had expired at the provider."""
        self._access.clear()


def _s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _redirect(redirect_uri: str, **params: str | None) -> httpx.Response:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    sep = "&" if "?" in redirect_uri else "?"
    return httpx.Response(302, headers={"Location": f"{redirect_uri}{sep}{query}"})


def _json(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, content=json.dumps(body), headers={"Content-Type": "application/json"})
