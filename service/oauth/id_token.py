"""OpenID Connect ID tokens (Core 3.1.3.7) on joserfc: the signature against the provider's JWKS, then the claims.

One function per clause of the spec, each quoting it (as authlib's `claims.py` does): `_signed_claims` (items 6-7),
then `CLAIM_CHECKS` in order: `_iss`, `_aud_azp`, `_exp_iat`, `_nonce`, `_sub`.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from service.core.errors import IdTokenError, ProviderError
from service.providers import TENANT_ID_PLACEHOLDER

from .issuer import issuer_matches
from .resolved import ResolvedProvider

log = logging.getLogger("service.oauth")

# Asymmetric algorithms only: never "none", never HS* (a shared secret would let anyone holding it sign).
ID_TOKEN_ALGORITHMS = [
    *("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA", "Ed25519"),
]
CLOCK_LEEWAY = 60  # seconds of clock difference tolerated on exp and iat
JWKS_TTL = 3600.0  # keys are re-read at least this often
JWKS_MIN_REFRESH = 30.0  # an unknown key id triggers a re-read at most this often (per JWKS)
_SIGNING_KEY_TYPES = frozenset({"RSA", "EC", "OKP"})


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
            try:
                key_set = await _fetch_jwks(uri, http)
            except ProviderError as exc:
                if cached is None:
                    raise
                # Keys read before are better than none; the next use tries again.
                log.warning("%s; using the keys read %.0f s ago", exc, now - cached[0])
                return cached[1]
            self._sets[uri] = (now, key_set)
            return key_set


async def _fetch_jwks(uri: str, http: httpx.AsyncClient) -> KeySet:
    def failed(problem: str) -> ProviderError:
        return ProviderError(f"the signing keys at {uri} could not be read ({problem})", code="provider_jwks_error")

    try:
        response = await http.get(uri, headers={"Accept": "application/json"})
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


@dataclass(frozen=True, slots=True)
class IdTokenExpectations:
    """What an ID token must say, besides a valid signature by the provider and our client id in `aud`."""

    issuer: str  # exactly (`{tenantid}` stands for the token's own `tid`)
    nonce: str | None  # the nonce our authorization request carried
    nonce_required: bool = True  # False for a refresh's ID token: it may omit the nonce (OpenID Connect Core §12.2)
    subject: str | None = None  # on refresh: the account the grant belongs to
    issued_after: float | None = None  # epoch seconds when the sign-in began: `iat` may not be earlier
    leeway: float = CLOCK_LEEWAY  # seconds of clock difference tolerated on exp and iat


async def validate_id_token(
    entry: ResolvedProvider,
    id_token: str | None,
    expect: IdTokenExpectations,
    *,
    jwks: JwksCache,
    http: httpx.AsyncClient,
    now: float,
) -> dict[str, Any]:
    """Check an ID token from the token endpoint in full (OpenID Connect Core 3.1.3.7, 12.2) and return its claims.

    The signature first (nothing in a token that fails it can be believed), then each claim, one check per clause.
    Raises IdTokenError naming the failed check, or ProviderError when the provider's keys cannot be read.
    """
    claims = await _signed_claims(entry, id_token, jwks=jwks, http=http)
    for check in CLAIM_CHECKS:
        check(entry, claims, expect, now)
    return claims


async def _signed_claims(
    entry: ResolvedProvider, id_token: str | None, *, jwks: JwksCache, http: httpx.AsyncClient
) -> dict[str, Any]:
    """Core 3.1.3.7, items 6 and 7: "The Client MUST validate the signature of all other ID Tokens according to JWS
    using the algorithm specified in the JWT alg Header Parameter. The Client MUST use the keys provided by the
    Issuer." and "The alg value SHOULD be the default of RS256 or the algorithm sent by the Client in the
    id_token_signed_response_alg parameter during Registration."

    The token endpoint's TLS would allow skipping this (item 6); the connector checks it anyway, with asymmetric
    algorithms only (those the provider is configured with, when it is)."""
    if not id_token:
        raise IdTokenError(entry, "presence")
    if entry.jwks_uri is None:
        raise ProviderError(
            f"{entry.display_name} has no jwks_uri to check ID tokens with (provider '{entry.name}')",
            code="provider_misconfigured",
        )
    algorithms = [a for a in ID_TOKEN_ALGORITHMS if entry.id_token_algorithms is None or a in entry.id_token_algorithms]
    key_set = await jwks.get(entry.jwks_uri, http)
    try:
        try:
            token = jwt.decode(id_token, key_set, algorithms=algorithms)
        except InvalidKeyIdError:
            # The provider may have rotated its keys since we read them: read them again (rate-limited).
            key_set = await jwks.get(entry.jwks_uri, http, refresh=True)
            token = jwt.decode(id_token, key_set, algorithms=algorithms)
    except (JoseError, ValueError, TypeError):
        # A bad signature, an unknown key, `alg` none or HS*, or not a JWT at all: nothing here can be believed.
        raise IdTokenError(entry, "signature") from None
    return dict(token.claims)


def _iss(entry: ResolvedProvider, claims: Mapping[str, Any], expect: IdTokenExpectations, now: float) -> None:
    """Core 3.1.3.7, item 2: "The Issuer Identifier for the OpenID Provider (which is typically obtained during
    Discovery) MUST exactly match the value of the iss (issuer) Claim."

    A multi-tenant issuer (`{tenantid}`) matches only with the token's own `tid` in its place."""
    issuer = claims.get("iss")
    tenant = None
    if TENANT_ID_PLACEHOLDER in expect.issuer:
        tenant = claims.get("tid")
        if not isinstance(tenant, str):
            raise IdTokenError(entry, "iss")
    if not isinstance(issuer, str) or not issuer_matches(expect.issuer, issuer, tenant_id=tenant):
        raise IdTokenError(entry, "iss")


def _aud_azp(entry: ResolvedProvider, claims: Mapping[str, Any], expect: IdTokenExpectations, now: float) -> None:
    """Core 3.1.3.7, items 3 to 5: "The Client MUST validate that the aud (audience) Claim contains its client_id
    value registered at the Issuer identified by the iss (issuer) Claim as an audience. [...] The ID Token MUST be
    rejected if the ID Token does not list the Client as a valid audience", "If the ID Token contains multiple
    audiences, the Client SHOULD verify that an azp Claim is present." and "If an azp (authorized party) Claim is
    present, the Client SHOULD verify that its client_id is the Claim Value."

    Both SHOULDs are kept as MUSTs."""
    audience = claims.get("aud")
    audiences = [audience] if isinstance(audience, str) else audience
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise IdTokenError(entry, "aud")
    if entry.client_id not in audiences:
        raise IdTokenError(entry, "aud")
    azp = claims.get("azp")
    if (len(audiences) > 1 or azp is not None) and azp != entry.client_id:
        raise IdTokenError(entry, "azp")


def _exp_iat(entry: ResolvedProvider, claims: Mapping[str, Any], expect: IdTokenExpectations, now: float) -> None:
    """Core 3.1.3.7, items 9 and 10: "The current time MUST be before the time represented by the exp Claim
    (possibly allowing for some small leeway to account for clock skew)." and "The iat Claim can be used to reject
    tokens that were issued too far away from the current time [...] The acceptable range is Client specific."

    Here: `iat` not in the future, and not before the sign-in began (a token issued earlier answers another one),
    each with `expect.leeway`."""
    leeway = expect.leeway
    expires = _number(claims.get("exp"))
    if expires is None or expires <= now - leeway:
        raise IdTokenError(entry, "exp")
    issued = _number(claims.get("iat"))
    if issued is None or issued > now + leeway:
        raise IdTokenError(entry, "iat")
    if expect.issued_after is not None and issued < expect.issued_after - leeway:
        raise IdTokenError(entry, "iat")


def _nonce(entry: ResolvedProvider, claims: Mapping[str, Any], expect: IdTokenExpectations, now: float) -> None:
    """Core 3.1.3.7, item 11: "If a nonce value was sent in the Authentication Request, a nonce Claim MUST be
    present and its value checked to verify that it is the same value as the one that was sent in the Authentication
    Request."

    A refresh's ID token (`nonce_required` off) may omit it: Core 12.2 does not list the nonce among what a
    refreshed ID token repeats; one that is present must still be the original one. Compared in constant time."""
    received = claims.get("nonce")
    must_match = expect.nonce_required or (received is not None and expect.nonce is not None)
    if must_match and not _same_text(received, expect.nonce):
        raise IdTokenError(entry, "nonce")


def _sub(entry: ResolvedProvider, claims: Mapping[str, Any], expect: IdTokenExpectations, now: float) -> None:
    """Core 2: "sub REQUIRED. Subject Identifier. [...] It MUST NOT exceed 255 ASCII characters in length." and,
    on refresh, Core 12.2: "its sub Claim Value MUST be the same as in the ID Token issued when the original
    authentication occurred"."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject or len(subject) > 255:
        raise IdTokenError(entry, "sub")
    if expect.subject is not None and subject != expect.subject:
        raise IdTokenError(entry, "sub")


ClaimCheck = Callable[[ResolvedProvider, Mapping[str, Any], IdTokenExpectations, float], None]
# In the order of Core 3.1.3.7; the first that fails names the check in the IdTokenError.
CLAIM_CHECKS: tuple[ClaimCheck, ...] = (_iss, _aud_azp, _exp_iat, _nonce, _sub)


def unverified_claims(id_token: str) -> dict[str, Any]:
    """The claims of an ID token this connector checked and stored before, read without checking it again."""
    try:
        payload = id_token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _same_text(received: object, expected: str | None) -> bool:
    if expected is None or not isinstance(received, str):
        return False
    return hmac.compare_digest(received.encode(), expected.encode())


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None
