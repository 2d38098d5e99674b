"""A mock OAuth 2.0 provider that really checks client auth, redirect URI, PKCE and codes.

Use it to test an agent end to end without a real provider: it plays GitHub-like authorize, token,
userinfo, revocation and a small API (`/api/user`, `/api/user/repos`). Revoking a token (RFC 7009) ends every
token of its grant, as conformant providers do.

`MockOAuthProvider.strict()` is as strict as a conformant OpenID provider on what connectors get wrong, each
switchable on its own: Basic client credentials are form-decoded (RFC 6749 §2.3.1: a secret with `+` sent raw
fails), `offline_access` is dropped without `prompt=consent` and refresh tokens come only with it, scopes named in
`narrow_scopes` are refused at consent (a narrowed grant), access tokens live 30 seconds, and its client secret
contains `+/=:`. `MockOIDCProvider.strict()` also returns an ID token on refresh.

The endpoint logic works on plain `MockRequest` / `MockResponse` values (`mock_http`); `mock_serving` puts it on a
transport: a respx router in-process, or uvicorn on loopback (`acp-connector mock-provider --port N` standalone).
`issue_legacy_token()` hands out a legacy grant's token, migrated by a token exchange (`mock_legacy`).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self
from urllib.parse import parse_qs, unquote_plus, urlsplit

from .mock_grants import _Grant, _IssuedCode
from .mock_http import MockRequest, MockResponse, s256
from .mock_legacy import TOKEN_EXCHANGE, LegacyTokens, MockLegacy
from .mock_serving import MockServing
from .sign_in import SignInPages
from .sign_in import page as sign_in_page

if TYPE_CHECKING:
    pass


@dataclass
class MockOAuthProvider(MockServing, MockLegacy):
    """A provider at `base_url` that issues real-looking, random tokens and validates every step."""

    base_url: str = "https://oauth.mock-provider.test"
    display_name: str = "Mock Provider"
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
    # A sign-in page at /authorize (choose a user, approve or deny, untick scopes), as a real provider shows one;
    # off, consent is given at once (fast tests). `users` are the accounts to choose from besides `account`.
    sign_in_page: bool = False
    users: list[dict[str, Any]] = field(default_factory=list)
    # Over HTTP: seconds a refresh (or token exchange) answer takes to leave, after the refresh token was already
    # rotated (the legacy token already exchanged).
    refresh_delay: float = 0.0
    # Refreshes (and token exchanges) whose answer is lost after the rotation: the client's call times out (respx:
    # at once; over HTTP: after the client's own timeout), and the refresh token (legacy token) it sent is dead.
    lose_refresh_answers: int = 0
    # Legacy grants (Shopify's non-expiring tokens) and their migration by token exchange (`mock_legacy`).
    legacy: LegacyTokens = field(default_factory=LegacyTokens)
    # Strictness (all on in `strict()`):
    form_encoded_basic: bool = False  # Basic credentials are form-decoded only (else raw is accepted too)
    offline_access_needs_consent: bool = False  # offline_access is dropped unless prompt includes consent
    refresh_token_needs_offline_access: bool = False  # a refresh token only for a grant with offline_access
    narrow_scopes: set[str] = field(default_factory=set)  # refused at consent: the grant lacks them
    # False: a refresh keeps the refresh token valid and answers without a new one (Google-style), instead of
    # rotating it (the old one dies, a new one comes back).
    rotate_refresh_tokens: bool = True
    # OAuth errors the next token-endpoint calls answer, one per call, e.g. ["invalid_grant"] or
    # ["temporarily_unavailable"] (server_error: 500, temporarily_unavailable: 503, invalid_client: 401, else 400).
    token_errors: list[str] = field(default_factory=list)
    # HTTP answers without an OAuth body the next token-endpoint calls get, one per call, as (status, headers):
    # e.g. [(503, {}), (429, {"retry-after": "7"})]: an outage, not a refusal. Nothing is issued or rotated.
    token_outages: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    # Token-endpoint calls that get no answer at all (respx: the call times out at once; over HTTP: the client's
    # own timeout ends it). Nothing is issued or rotated.
    token_timeouts: int = 0
    # Over HTTP: seconds every answer waits before it leaves (a slow provider).
    response_delay: float = 0.0
    issued_access_tokens: list[str] = field(default_factory=list)
    issued_refresh_tokens: list[str] = field(default_factory=list)
    issued_codes: list[str] = field(default_factory=list)
    # scope, prompt and the account named (login, login_hint) asked
    authorization_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)  # grant_type and the client_auth used
    revocation_requests: list[dict[str, str]] = field(default_factory=list)  # token_type_hint, client_auth
    api_calls: list[str] = field(default_factory=list)
    _codes: dict[str, _IssuedCode] = field(default_factory=dict)
    _access: set[str] = field(default_factory=set)
    _refresh: set[str] = field(default_factory=set)
    _grants: dict[str, _Grant] = field(default_factory=dict)  # token -> its grant
    _sign_ins: SignInPages = field(default_factory=SignInPages.empty)

    STRICT: ClassVar[dict[str, Any]] = {
        "form_encoded_basic": True,
        "offline_access_needs_consent": True,
        "refresh_token_needs_offline_access": True,
        "expires_in": 30,
    }

    @classmethod
    def strict(cls, **overrides: Any) -> Self:
        """A provider as strict as a conformant OpenID provider (see the module's doc); `overrides` set fields."""
        secret = "mock+secret/" + secrets.token_urlsafe(12) + "=:"
        return cls(**{"client_secret": secret, **cls.STRICT, **overrides})

    # -- configuration a catalog needs ---------------------------------------------------------------
    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    def catalog_entry(self) -> dict[str, Any]:
        """The provider's table for a providers.toml (credentials go in the environment)."""
        return {
            "display_name": self.display_name,
            "authorization_endpoint": f"{self.base_url}/authorize",
            "token_endpoint": f"{self.base_url}/token",
            "revocation_endpoint": f"{self.base_url}/revoke",
            "userinfo_endpoint": f"{self.base_url}/api/user",
            "api_base_url": f"{self.base_url}/api",
            "default_scopes": ["read:user"],
            "account_id_field": "id",
            # As GitHub: its account picker, and `login` naming the account to sign in with.
            "select_account_prompt": "select_account",
            "login_hint_parameter": "login",
        }

    def secrets_issued(self) -> list[str]:
        """Every secret this provider handed out or holds: for scanning logs and messages."""
        return [
            self.client_secret,
            *self.issued_access_tokens,
            *self.issued_refresh_tokens,
            *self.issued_codes,
        ]

    def expire_access_tokens(self) -> None:
        """Make every issued access token invalid, as if they had expired at the provider."""
        self._access.clear()

    def revoke_refresh_tokens(self) -> None:
        """Make every issued refresh token invalid, as if the user had revoked the grant at the provider."""
        self._refresh.clear()

    def token_active(self, token: str) -> bool:
        """Whether an access or refresh token this provider issued is still accepted (introspection)."""
        return token in self._access or token in self._refresh

    # -- the transport-independent core ----------------------------------------------------------------
    def _routes(self) -> dict[tuple[str, str], Callable[[MockRequest], MockResponse]]:
        return {
            ("GET", "/authorize"): self._authorize,
            ("POST", "/authorize"): self._signed_in,
            ("POST", "/token"): self._token,
            ("POST", "/revoke"): self._revoke,
            ("GET", "/api/user"): self._user,
            ("GET", "/api/user/repos"): self._repos,
        }

    def handle(self, request: MockRequest) -> MockResponse:
        """Answer one request; `request.path` is relative to `base_url` (e.g. "/token")."""
        endpoint = self._routes().get((request.method.upper(), request.path))
        if endpoint is None:
            return MockResponse.json(404, {"error": "not_found"})
        return endpoint(request)

    def _timed_out(self, request: MockRequest) -> bool:
        """Whether the token endpoint leaves this call unanswered (while `token_timeouts` lasts; counted)."""
        if self.token_timeouts <= 0 or request.path != "/token":
            return False
        self.token_timeouts -= 1
        self.token_requests.append({"grant_type": request.form().get("grant_type", ""), "client_auth": "timed_out"})
        return True

    def _answer_lost(self, request: MockRequest, answer: MockResponse) -> bool:
        """Whether to drop this answer (a successful refresh, while `lose_refresh_answers` lasts)."""
        if self.lose_refresh_answers <= 0 or answer.status != 200:  # (the token endpoint's path: any emulated one)
            return False
        if request.params().get("grant_type") not in ("refresh_token", TOKEN_EXCHANGE):
            return False
        self.lose_refresh_answers -= 1
        return True

    # -- endpoints -------------------------------------------------------------------------------------
    def _authorize(self, request: MockRequest) -> MockResponse:
        q = request.query
        redirect_uri = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id or not redirect_uri:
            return MockResponse.text(400, "unknown client or missing redirect_uri")
        if q.get("response_type") != "code":
            return MockResponse.redirect(redirect_uri, error="unsupported_response_type", state=q.get("state"))
        if self.deny_next is not None:
            error, self.deny_next = self.deny_next, None
            return MockResponse.redirect(redirect_uri, error=error, state=q.get("state"))
        challenge = q.get("code_challenge")
        if self.require_pkce and (challenge is None or q.get("code_challenge_method") != "S256"):
            return MockResponse.redirect(redirect_uri, error="invalid_request", state=q.get("state"))
        self.authorization_requests.append({k: q[k] for k in ("scope", "prompt", "login", "login_hint") if k in q})
        if self.sign_in_page:
            return self._sign_in_page(dict(q))
        return self._consented(q, q.get("scope", ""), dict(self.account))  # as whoever is signed in now

    def _consented(self, q: Mapping[str, str], scope: str, account: dict[str, Any] | None) -> MockResponse:
        """Consent to `scope` of the request `q` as `account`: a code, redirected to the client."""
        code = "mock_code_" + secrets.token_urlsafe(24)
        self.issued_codes.append(code)
        granted = self._granted_scope(scope, q.get("prompt", ""))
        redirect_uri = q["redirect_uri"]
        challenge = q.get("code_challenge")
        self._codes[code] = _IssuedCode(self.client_id, redirect_uri, granted, challenge, q.get("nonce"), account)
        return MockResponse.redirect(redirect_uri, code=code, state=q.get("state"))

    def _sign_in_page(self, q: dict[str, str]) -> MockResponse:
        html, headers = sign_in_page(
            provider_name=self.display_name,
            action=f"{urlsplit(self.base_url).path.rstrip('/')}/authorize",
            request_id=self._sign_ins.open(q),
            query=q,
            users=[self.account, *self.users],
        )
        return MockResponse(200, headers, html.encode())

    def _signed_in(self, request: MockRequest) -> MockResponse:
        """The sign-in page's answer: deny, or approve as the chosen user with the scopes left ticked."""
        form = parse_qs(request.body.decode("utf-8", errors="replace"))
        pending = self._sign_ins.take(form.get("request", [""])[0])
        if pending is None:
            return MockResponse.text(400, "this sign-in is unknown or was already answered: start again")
        q = pending.query
        if form.get("action", [""])[0] != "approve":
            return MockResponse.redirect(q["redirect_uri"], error="access_denied", state=q.get("state"))
        accounts = [self.account, *self.users]
        chosen = form.get("user", ["0"])[0]
        account = accounts[int(chosen)] if chosen.isdigit() and int(chosen) < len(accounts) else self.account
        ticked = set(form.get("scope", []))
        return self._consented(q, " ".join(scope for scope in pending.scopes if scope in ticked), account)

    def _granted_scope(self, requested: str, prompt: str) -> str:
        """What the (automatic) consent grants of `requested`: less `narrow_scopes`, and `offline_access` only
        with prompt=consent when `offline_access_needs_consent` (OpenID Connect Core §11)."""
        granted = [scope for scope in requested.split() if scope not in self.narrow_scopes]
        if self.offline_access_needs_consent and "consent" not in prompt.split():
            granted = [scope for scope in granted if scope != "offline_access"]
        return " ".join(granted)

    def _client_auth(self, request: MockRequest, form: Mapping[str, str]) -> str | None:
        """The client authentication method the request used successfully, or None (RFC 6749 §2.3.1)."""
        header = request.header("authorization")
        if header.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(header[6:], validate=True).decode()
            except ValueError:
                return None
            cid, _, secret = decoded.partition(":")
            candidates = [(unquote_plus(cid), unquote_plus(secret))]
            if not self.form_encoded_basic:
                candidates.append((cid, secret))  # lenient, as many providers are: the raw values as well
            ok = any(c == (self.client_id, self.client_secret) for c in candidates)
            return "client_secret_basic" if ok else None
        if form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret:
            return "client_secret_post"
        return None

    def _token(self, request: MockRequest) -> MockResponse:
        form = request.params()
        method = self._client_auth(request, form)
        self.token_requests.append({"grant_type": form.get("grant_type", ""), "client_auth": method or "failed"})
        if method is None:
            return MockResponse.json(401, {"error": "invalid_client"})
        if self.token_outages:
            status, headers = self.token_outages.pop(0)
            return MockResponse(status, headers, b"<html>unavailable</html>")
        if self.token_errors:
            error = self.token_errors.pop(0)
            status = _TOKEN_ERROR_STATUS.get(error, 400)
            return MockResponse.json(status, {"error": error, "error_description": "configured to fail"})
        grant_type = form.get("grant_type")
        if grant_type == "authorization_code":
            issued = self._codes.get(form.get("code", ""))
            if issued is None or issued.used:
                return MockResponse.json(400, {"error": "invalid_grant", "error_description": "bad or used code"})
            issued.used = True
            if form.get("redirect_uri") != issued.redirect_uri:
                return MockResponse.json(400, {"error": "invalid_grant", "error_description": "redirect_uri mismatch"})
            if issued.code_challenge is not None:
                verifier = form.get("code_verifier", "")
                if s256(verifier) != issued.code_challenge:
                    return MockResponse.json(400, {"error": "invalid_grant", "error_description": "PKCE check failed"})
            refreshable = self.issue_refresh_token and (
                not self.refresh_token_needs_offline_access or "offline_access" in issued.scope.split()
            )
            if self.legacy.on_code_exchange:  # as before the provider's expiring tokens: a legacy grant
                token = self.issue_legacy_token(issued.account, issued.scope)
                return MockResponse.json(200, {"access_token": token, "token_type": "bearer", "scope": issued.scope})
            grant = _Grant(issued.scope, issued.nonce, refreshable, issued.account)
            return MockResponse.json(200, self._issue(grant, with_scope=True))
        if grant_type == "refresh_token":
            old = form.get("refresh_token", "")
            if old not in self._refresh:
                return MockResponse.json(400, {"error": "invalid_grant", "error_description": "bad refresh token"})
            if not self.rotate_refresh_tokens:
                return MockResponse.json(200, self._issue(self._grants[old], with_scope=False, refresh=False))
            self._refresh.discard(old)  # rotation: the old refresh token dies
            return MockResponse.json(200, self._issue(self._grants[old], with_scope=False))
        if grant_type == TOKEN_EXCHANGE:
            return self._exchange(form)
        return MockResponse.json(400, {"error": "unsupported_grant_type"})

    def _issue(
        self, grant: _Grant, *, with_scope: bool, refresh: bool = True, expires_in: int | None = None
    ) -> dict[str, Any]:
        access = "mock_at_" + secrets.token_urlsafe(24)
        self.issued_access_tokens.append(access)
        self._access.add(access)
        self._grants[access] = grant
        grant.tokens.add(access)
        body: dict[str, Any] = {"access_token": access, "token_type": "bearer"}
        if with_scope:
            body["scope"] = ",".join(grant.scope.split()) if self.comma_scopes else grant.scope
        if (expires_in or self.expires_in) is not None:
            body["expires_in"] = expires_in or self.expires_in
        if grant.refreshable and refresh:
            refresh_token = "mock_rt_" + secrets.token_urlsafe(24)
            self.issued_refresh_tokens.append(refresh_token)
            self._refresh.add(refresh_token)
            self._grants[refresh_token] = grant
            grant.tokens.add(refresh_token)
            body["refresh_token"] = refresh_token
        return body

    def _revoke(self, request: MockRequest) -> MockResponse:
        form = request.form()
        method = self._client_auth(request, form)
        self.revocation_requests.append(
            {"token_type_hint": form.get("token_type_hint", ""), "client_auth": method or "failed"}
        )
        if method is None:
            return MockResponse.json(401, {"error": "invalid_client"})
        grant = self._grants.get(form.get("token", ""))
        if grant is not None:  # RFC 7009 §2.1: every token of the grant goes with it
            self._access -= grant.tokens
            self._refresh -= grant.tokens
        return MockResponse(200)

    def _bearer_ok(self, request: MockRequest) -> bool:
        header = request.header("authorization")
        return header.lower().startswith("bearer ") and self.api_accepts(header[7:])

    def _user(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(self._api_path(request))
        if not self._bearer_ok(request):
            return MockResponse.json(401, {"message": "Bad credentials"})
        account = self._grants[request.header("authorization")[7:]].account
        return MockResponse.json(200, account or self.account)

    def _repos(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(self._api_path(request))
        if not self._bearer_ok(request):
            return MockResponse.json(401, {"message": "Bad credentials"})
        return MockResponse.json(200, self.repos)

    def _api_path(self, request: MockRequest) -> str:
        """The full request path, as recorded in `api_calls` (e.g. "/api/user/repos")."""
        return urlsplit(self.base_url).path.rstrip("/") + request.path


_TOKEN_ERROR_STATUS = {
    "server_error": 500,
    "temporarily_unavailable": 503,
    "invalid_client": 401,
    "bad_refresh_token": 200,  # GitHub answers its dead refresh token with HTTP 200
}


__all__ = ["MockOAuthProvider", "MockRequest", "MockResponse"]
