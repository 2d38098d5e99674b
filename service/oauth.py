"""The OAuth client side, on authlib: authorization URLs, code exchange, refresh, revocation, account lookup.

Also OpenID Connect ID-token validation (on joserfc): signature against the provider's JWKS (`JwksCache`),
then `iss`, `aud`/`azp`, `exp`, `iat`, `nonce` and `sub`. The only module that talks to providers. Errors it
raises carry the provider's error code and HTTP status, never a token, code, verifier or client secret.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import authlib.deprecate  # noqa: F401 - installs an "always" filter that the ignore below must follow
import httpx
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

with warnings.catch_warnings():
    # authlib 1.9 prefers the `httpx2` fork and warns when it falls back to httpx, which is what we use.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client

from .errors import ProviderError
from .providers import TENANT_ID_PLACEHOLDER, ProviderEntry, issuer_matches

log = logging.getLogger("service.oauth")

HTTP_TIMEOUT = httpx.Timeout(15.0)


@dataclass(frozen=True, slots=True)
class FlowSecrets:
    """Per-transaction values: `state` goes to the provider and back, the verifier never leaves the server."""

    state: str
    code_verifier: str | None
    nonce: str | None

    def __repr__(self) -> str:
        return "FlowSecrets(<redacted>)"


@dataclass(frozen=True, slots=True)
class TokenSet:
    access_token: str
    token_type: str
    refresh_token: str | None
    expires_at: float | None  # epoch seconds
    scopes: tuple[str, ...] | None  # as granted, when the provider says
    id_token: str | None = None

    def __repr__(self) -> str:
        return f"TokenSet(token_type={self.token_type!r}, expires_at={self.expires_at!r}, scopes={self.scopes!r})"

    def to_json(self) -> dict[str, Any]:
        return {
            "access_token": self.access_token,
            "token_type": self.token_type,
            "refresh_token": self.refresh_token,
            "expires_at": self.expires_at,
            "scopes": list(self.scopes) if self.scopes is not None else None,
            "id_token": self.id_token,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenSet:
        scopes = data.get("scopes")
        return cls(
            access_token=str(data["access_token"]),
            token_type=str(data.get("token_type") or "Bearer"),
            refresh_token=data.get("refresh_token"),
            expires_at=data.get("expires_at"),
            scopes=tuple(scopes) if scopes is not None else None,
            id_token=data.get("id_token"),
        )

    def expires_within(self, seconds: float, *, now: float | None = None) -> bool:
        if self.expires_at is None:
            return False
        return self.expires_at - (time.time() if now is None else now) <= seconds


def new_flow_secrets(entry: ProviderEntry) -> FlowSecrets:
    return FlowSecrets(
        state=secrets.token_urlsafe(32),
        code_verifier=secrets.token_urlsafe(64) if entry.pkce else None,  # 86 chars, within RFC 7636's 43..128
        nonce=secrets.token_urlsafe(24) if entry.oidc else None,
    )


def _client(entry: ProviderEntry, *, redirect_uri: str | None = None) -> AsyncOAuth2Client:
    secret = entry.client_secret.get_secret_value() if entry.client_secret is not None else None
    return AsyncOAuth2Client(
        client_id=entry.client_id,
        client_secret=secret,
        token_endpoint_auth_method=entry.token_endpoint_auth_method,
        redirect_uri=redirect_uri,
        code_challenge_method="S256" if entry.pkce else None,
        timeout=HTTP_TIMEOUT,
    )


def authorization_scopes(entry: ProviderEntry, scopes: Sequence[str]) -> str:
    """The `scope` parameter sent: an OpenID Connect provider is always asked for `openid` (so an ID token)."""
    return entry.join_scopes(("openid", *scopes) if entry.oidc else scopes)


def authorization_url(entry: ProviderEntry, *, redirect_uri: str, scopes: Sequence[str], flow: FlowSecrets) -> str:
    if entry.authorization_endpoint is None:
        raise ProviderError(f"provider '{entry.name}' has no authorization endpoint", code="provider_misconfigured")
    extra: dict[str, str] = dict(entry.extra_authorize_params)
    if flow.nonce is not None:
        extra["nonce"] = flow.nonce
    client = _client(entry, redirect_uri=redirect_uri)
    url, _ = client.create_authorization_url(
        entry.authorization_endpoint,
        state=flow.state,
        code_verifier=flow.code_verifier,
        scope=authorization_scopes(entry, scopes),
        **extra,
    )
    return str(url)


def _token_set(raw: Mapping[str, Any], entry: ProviderEntry) -> TokenSet:
    access_token = raw.get("access_token")
    if not isinstance(access_token, str) or not access_token:
        raise ProviderError(f"provider '{entry.name}' returned no access token", code="provider_bad_response")
    expires_at = raw.get("expires_at")
    if expires_at is None and raw.get("expires_in") is not None:
        expires_at = time.time() + float(raw["expires_in"])
    granted = raw.get("scope")
    scopes: tuple[str, ...] | None = None
    if isinstance(granted, str):
        # Providers differ: GitHub and Slack separate granted scopes with commas, others with spaces.
        scopes = tuple(s for s in granted.replace(",", " ").split() if s)
    return TokenSet(
        access_token=access_token,
        token_type=str(raw.get("token_type") or "Bearer"),
        refresh_token=raw.get("refresh_token"),
        expires_at=float(expires_at) if expires_at is not None else None,
        scopes=scopes,
        id_token=raw.get("id_token"),
    )


def _provider_error(entry: ProviderEntry, action: str, exc: Exception) -> ProviderError:
    if isinstance(exc, OAuthError):
        detail = f"error={exc.error}"
    elif isinstance(exc, httpx.HTTPStatusError):
        detail = f"HTTP {exc.response.status_code}"
    elif isinstance(exc, httpx.HTTPError):
        detail = type(exc).__name__
    else:
        detail = "unreadable response"
    return ProviderError(f"{entry.display_name} refused the {action} ({detail})", code="provider_token_error")


async def exchange_code(entry: ProviderEntry, *, redirect_uri: str, code: str, code_verifier: str | None) -> TokenSet:
    if entry.token_endpoint is None:
        raise ProviderError(f"provider '{entry.name}' has no token endpoint", code="provider_misconfigured")
    kwargs: dict[str, Any] = {}
    if code_verifier is not None:
        kwargs["code_verifier"] = code_verifier
    async with _client(entry, redirect_uri=redirect_uri) as client:
        try:
            raw = await client.fetch_token(entry.token_endpoint, grant_type="authorization_code", code=code, **kwargs)
        except (OAuthError, httpx.HTTPError, ValueError) as exc:
            raise _provider_error(entry, "authorization code exchange", exc) from None
    return _token_set(raw, entry)


async def refresh(entry: ProviderEntry, token: TokenSet) -> TokenSet:
    if token.refresh_token is None or entry.token_endpoint is None:
        raise ProviderError(f"the {entry.display_name} grant cannot be refreshed", code="not_refreshable")
    async with _client(entry) as client:
        try:
            raw = await client.refresh_token(entry.token_endpoint, refresh_token=token.refresh_token)
        except (OAuthError, httpx.HTTPError, ValueError) as exc:
            raise _provider_error(entry, "token refresh", exc) from None
    fresh = _token_set(raw, entry)
    # Providers without rotation keep the old refresh token valid and may omit the scopes.
    return replace(
        fresh,
        refresh_token=fresh.refresh_token or token.refresh_token,
        scopes=fresh.scopes if fresh.scopes is not None else token.scopes,
    )


async def revoke(entry: ProviderEntry, token: TokenSet) -> bool:
    """Best-effort revocation (RFC 7009). False when the provider has no endpoint or refused."""
    if entry.revocation_endpoint is None:
        return False
    async with _client(entry) as client:
        try:
            target = token.refresh_token or token.access_token
            hint = "refresh_token" if token.refresh_token else "access_token"
            response = await client.revoke_token(entry.revocation_endpoint, token=target, token_type_hint=hint)
        except (OAuthError, httpx.HTTPError) as exc:
            log.warning("revocation at %s failed: %s", entry.name, type(exc).__name__)
            return False
    return bool(response.status_code < 400)


async def fetch_account(
    entry: ProviderEntry, token: TokenSet, id_claims: Mapping[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """Who the token belongs to: (provider account id, profile).

    With validated ID-token claims the account is their `sub` (signed by the provider); the userinfo answer,
    when there is an endpoint, must then name the same `sub` if it names one (OpenID Connect Core 5.3.2).
    Without them the account is the userinfo field `account_id_field`.
    """
    if id_claims is not None:
        subject = str(id_claims["sub"])
        if entry.userinfo_endpoint is None:
            return subject, {}
        _, profile = await _userinfo(entry, token)
        if "sub" in profile and str(profile["sub"]) != subject:
            raise ProviderError(
                f"{entry.display_name} userinfo names another account than the ID token", code="provider_bad_response"
            )
        return subject, profile
    return await _userinfo(entry, token)


async def _userinfo(entry: ProviderEntry, token: TokenSet) -> tuple[str, dict[str, Any]]:
    if entry.userinfo_endpoint is None:
        raise ProviderError(f"provider '{entry.name}' has no userinfo endpoint", code="provider_misconfigured")
    headers = {"Authorization": f"Bearer {token.access_token}", "Accept": "application/json"}
    async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        try:
            response = await client.get(entry.userinfo_endpoint, headers=headers)
            response.raise_for_status()
            profile = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise _provider_error(entry, "account lookup", exc) from None
    if not isinstance(profile, dict):
        raise ProviderError(f"{entry.display_name} returned an unreadable profile", code="provider_bad_response")
    account = profile.get(entry.account_id_field)
    if account is None or account == "":
        raise ProviderError(
            f"{entry.display_name} profile has no '{entry.account_id_field}' field",
            code="provider_bad_response",
        )
    return str(account), profile


# --- OpenID Connect ID tokens -------------------------------------------------------------------------------

# Asymmetric algorithms only: never "none", never HS* (a shared secret would let anyone holding it sign).
ID_TOKEN_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "Ed25519"]
CLOCK_LEEWAY = 60  # seconds of clock difference tolerated on exp and iat
JWKS_TTL = 3600.0  # keys are re-read at least this often
JWKS_MIN_REFRESH = 30.0  # an unknown key id triggers a re-read at most this often (per JWKS)
_SIGNING_KEY_TYPES = frozenset({"RSA", "EC", "OKP"})


class IdTokenError(ProviderError):
    """The ID token failed one check (`check`: signature, iss, aud, azp, exp, iat, nonce, sub, ...)."""

    code = "invalid_id_token"

    def __init__(self, entry: ProviderEntry, check: str) -> None:
        super().__init__(f"{entry.display_name} sent an ID token that failed the {check} check")
        self.check = check


class JwksCache:
    """Signing keys per JWKS URI, fetched with the caller's HTTP client and kept for `ttl` seconds."""

    def __init__(
        self,
        *,
        ttl: float = JWKS_TTL,
        min_refresh: float = JWKS_MIN_REFRESH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.min_refresh = min_refresh
        self._clock = clock
        self._sets: dict[str, tuple[float, KeySet]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, uri: str, http: httpx.AsyncClient, *, refresh: bool = False) -> KeySet:
        """The key set at `uri`; `refresh` re-reads it unless it was read in the last `min_refresh` seconds."""
        async with self._locks.setdefault(uri, asyncio.Lock()):
            cached = self._sets.get(uri)
            now = self._clock()
            if cached is not None:
                age = now - cached[0]
                if age < self.ttl and (not refresh or age < self.min_refresh):
                    return cached[1]
            key_set = await _fetch_jwks(uri, http)
            self._sets[uri] = (now, key_set)
            return key_set


async def _fetch_jwks(uri: str, http: httpx.AsyncClient) -> KeySet:
    def failed(problem: str) -> ProviderError:
        return ProviderError(f"the signing keys at {uri} could not be read ({problem})", code="provider_jwks_error")

    try:
        response = await http.get(uri, headers={"Accept": "application/json"}, timeout=HTTP_TIMEOUT)
    except httpx.HTTPError as exc:
        raise failed(type(exc).__name__) from None
    if response.status_code != 200:
        raise failed(f"HTTP {response.status_code}")
    try:
        document = response.json()
    except ValueError:
        raise failed("not JSON") from None
    keys = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(keys, list):
        raise failed("no keys list")
    usable = [
        key
        for key in keys
        if isinstance(key, dict) and key.get("kty") in _SIGNING_KEY_TYPES and key.get("use", "sig") == "sig"
    ]
    try:
        return KeySet.import_key_set({"keys": usable})
    except (JoseError, ValueError, TypeError):
        raise failed("unreadable keys") from None


async def validate_id_token(
    entry: ProviderEntry,
    id_token: str | None,
    *,
    expected_issuer: str | None,
    nonce: str | None,
    jwks: JwksCache,
    http: httpx.AsyncClient,
    now: float,
) -> dict[str, Any]:
    """Check an ID token from the token endpoint in full (OpenID Connect Core 3.1.3.7) and return its claims.

    `expected_issuer` and `nonce` are the ones remembered for this authorization request. Raises IdTokenError
    naming the failed check, or ProviderError when the provider's keys cannot be read.
    """
    if not id_token:
        raise IdTokenError(entry, "presence")
    if entry.jwks_uri is None or expected_issuer is None or entry.client_id is None:
        raise ProviderError(
            f"provider '{entry.name}' lacks the issuer or jwks_uri needed to check ID tokens",
            code="provider_misconfigured",
        )
    key_set = await jwks.get(entry.jwks_uri, http)
    try:
        try:
            token = jwt.decode(id_token, key_set, algorithms=ID_TOKEN_ALGORITHMS)
        except InvalidKeyIdError:
            # The provider may have rotated its keys since we read them: read them again (rate-limited).
            key_set = await jwks.get(entry.jwks_uri, http, refresh=True)
            token = jwt.decode(id_token, key_set, algorithms=ID_TOKEN_ALGORITHMS)
    except JoseError:
        raise IdTokenError(entry, "signature") from None
    except (ValueError, TypeError):
        raise IdTokenError(entry, "format") from None
    claims: dict[str, Any] = dict(token.claims)

    issuer = claims.get("iss")
    tenant = claims.get("tid") if TENANT_ID_PLACEHOLDER in expected_issuer else None
    if TENANT_ID_PLACEHOLDER in expected_issuer and not isinstance(tenant, str):
        raise IdTokenError(entry, "iss")
    if not isinstance(issuer, str) or not issuer_matches(expected_issuer, issuer, tenant_id=tenant):
        raise IdTokenError(entry, "iss")

    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise IdTokenError(entry, "aud")
    if entry.client_id not in audiences:
        raise IdTokenError(entry, "aud")
    azp = claims.get("azp")
    if (len(audiences) > 1 or azp is not None) and azp != entry.client_id:
        raise IdTokenError(entry, "azp")

    expires = _number(claims.get("exp"))
    if expires is None or expires <= now - CLOCK_LEEWAY:
        raise IdTokenError(entry, "exp")
    issued = _number(claims.get("iat"))
    if issued is None or issued > now + CLOCK_LEEWAY:
        raise IdTokenError(entry, "iat")

    received = claims.get("nonce")
    if nonce is None or not isinstance(received, str) or not hmac.compare_digest(received.encode(), nonce.encode()):
        raise IdTokenError(entry, "nonce")

    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject or len(subject) > 255:
        raise IdTokenError(entry, "sub")
    return claims


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
