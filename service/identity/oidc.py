"""The `oidc` identity verifier: the browser signs in at the operator's OpenID Connect identity provider.

It trusts the identity provider named by `identity.oidc.discovery_url`, and only what it signed: the browser is
sent there with an authorization-code request (PKCE S256, single-use state, nonce); the ID token that comes back
through the token endpoint must carry a valid signature by a key from the provider's JWKS, the provider's
`iss`, our client id in `aud` (and `azp`), an unexpired `exp`, an `iat` not before the sign-in started, and our
nonce. The browser's identity is then (`iss`, `sub`). The only module that talks to the identity provider.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Annotated, Any

import authlib.deprecate  # noqa: F401 - installs an "always" filter that the ignore below must follow
import httpx
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet
from joserfc.jwt import JWTClaimsRegistry

with warnings.catch_warnings():
    # authlib 1.9 prefers the `httpx2` fork and warns when it falls back to httpx, which is what we use.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import NoDecode
from starlette.requests import Request
from starlette.responses import Response

from service.config import optional_str
from service.core.errors import FlowRefused, VaultError
from service.core.handles import handle_hash, verification_aad
from service.core.identity import Identity
from service.core.records import VerificationRecord
from service.core.urls import origin, url_problem
from service.core.verification import RedirectFirst, Returned, VerificationAttempt

from .base import RouteKit, VerifierContext, VerifierRoute, VerifierRoutes, claim_for_browser, insert_verification

log = logging.getLogger("service.identity.oidc")

CALLBACK_PATH = "/identity/oidc/callback"
DISCOVERY_SUFFIX = "/.well-known/openid-configuration"
# Asymmetric signatures only: never "none", never HMAC (which would make the client secret a signing key).
ALLOWED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
METADATA_TTL_SECONDS = 3600.0
JWKS_REFRESH_MIN_SECONDS = 30.0  # an unknown `kid` refetches the JWKS at most this often
HTTP_TIMEOUT = httpx.Timeout(15.0)
_ERROR_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass(frozen=True, slots=True)
class IdpMetadata:
    """The parts of the identity provider's discovery document the verifier uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...]
    iss_parameter_supported: bool


class _Unavailable(Exception):
    """The identity provider's metadata or keys could not be used; the message names what, never a secret."""


def _checked_url(document: dict[str, Any], key: str) -> str:
    value = document.get(key)
    if not isinstance(value, str) or not value:
        raise _Unavailable(f"discovery document has no {key}")
    problem = url_problem(value)
    if problem is not None:
        raise _Unavailable(f"{key} {problem}")
    return value


class OidcSettings(BaseModel):
    """`[identity.oidc]`: the operator's OpenID Connect identity provider (authorization code + PKCE)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    discovery_url: str | None = None  # .../.well-known/openid-configuration
    client_id: str | None = None
    client_secret: SecretStr | None = None  # environment only; unset: a public client (PKCE only)
    scopes: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["openid"])
    leeway_seconds: int = Field(default=60, ge=0, le=600)

    @field_validator("discovery_url", "client_id", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return optional_str(value)

    @field_validator("client_secret", mode="before")
    @classmethod
    def _empty_secret_is_none(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return optional_str(value)

    @field_validator("discovery_url")
    @classmethod
    def _check_discovery_url(cls, value: str | None) -> str | None:
        if value is not None and (problem := url_problem(value.strip())) is not None:
            raise ValueError(problem)
        return value.strip() if value is not None else None

    @field_validator("scopes", mode="before")
    @classmethod
    def _split_scopes(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(",", " ").split()
        return value


class OidcVerifier:
    name = "oidc"

    def __init__(self, ctx: VerifierContext, settings: OidcSettings) -> None:
        assert settings.discovery_url is not None and settings.client_id is not None
        self.ctx = ctx
        self.discovery_url = settings.discovery_url
        self.client_id = settings.client_id
        self._client_secret = settings.client_secret.get_secret_value() if settings.client_secret else None
        self.scopes = ["openid", *(s for s in settings.scopes if s != "openid")]
        self.leeway = settings.leeway_seconds
        self.redirect_uri = f"{ctx.flow.public_base_url}{CALLBACK_PATH}"
        self._metadata: IdpMetadata | None = None
        self._metadata_at = 0.0
        self._keys: KeySet | None = None
        self._keys_at = 0.0
        self._lock = asyncio.Lock()

    # -- the verifier -------------------------------------------------------------------------------------
    async def begin(self, attempt: VerificationAttempt) -> RedirectFirst:
        record = attempt.elicitation
        meta = await self._require_metadata(record.id)
        state = secrets.token_urlsafe(32)
        nonce = secrets.token_urlsafe(24)
        code_verifier = secrets.token_urlsafe(64)
        verification_id = secrets.token_urlsafe(16)
        key_id, blob = self.ctx.vault.encrypt(code_verifier.encode(), aad=verification_aad(verification_id))
        await insert_verification(
            self.ctx,
            attempt,
            verification_id=verification_id,
            verifier=self.name,
            handle_hash=handle_hash("oidc-state", state),
            nonce=nonce,
            pkce_key_id=key_id,
            pkce_ciphertext=blob,
        )
        async with self._client() as client:
            url, _ = client.create_authorization_url(
                meta.authorization_endpoint,
                state=state,
                code_verifier=code_verifier,
                nonce=nonce,
                scope=" ".join(self.scopes),
            )
        return RedirectFirst(str(url), verification_id)

    async def complete(self, params: dict[str, str], browser_binding: str | None) -> Returned:
        """The identity provider sent the browser back: check everything, return who signed in."""
        state = params.get("state")
        record = None
        if state:
            record = await self.ctx.store.verifications.get_by_handle(handle_hash("oidc-state", state))
        if record is None or record.verifier != self.name:
            raise FlowRefused(
                "unknown_verification", event="unknown_verification", audit={"identity_verifier": self.name}
            )
        record = await claim_for_browser(self.ctx, record, browser_binding, verifier=self.name)
        meta = await self._require_metadata(record.elicitation_id)
        received_iss = params.get("iss")
        if (received_iss is not None or meta.iss_parameter_supported) and received_iss != meta.issuer:
            raise self._refused("issuer_mismatch", "idp_issuer_mismatch", record, {"where": "response"})
        if "error" in params:
            error = params["error"] if _ERROR_CODE.fullmatch(params["error"]) else "error"
            raise FlowRefused(
                "sign_in_failed",
                detail={"error": error},
                event="idp_error",
                elicitation_id=record.elicitation_id,
                audit={"identity_verifier": self.name, "error": error},
            )
        code = params.get("code")
        if not code:
            raise self._refused("missing_code", "idp_error", record, {"error": "no code"})
        assert record.pkce_key_id is not None and record.pkce_ciphertext is not None
        try:
            code_verifier = self.ctx.vault.decrypt(
                record.pkce_key_id, record.pkce_ciphertext, aad=verification_aad(record.id)
            ).decode()
        except VaultError:  # its key was removed from the ring meanwhile: the user must start again
            raise self._refused("verification_expired", "verification_expired", record, {}) from None
        id_token = await self._exchange(meta, code, code_verifier, record)
        claims = await self._validate(meta, id_token, record)
        return Returned(record.elicitation_id, Identity(claims["iss"], claims["sub"]), record.id)

    async def form_targets(self) -> list[str]:
        try:
            meta = await self._get_metadata()
        except _Unavailable:
            return []
        return [origin(meta.authorization_endpoint)]

    # -- the identity provider ------------------------------------------------------------------------------
    def _client(self) -> AsyncOAuth2Client:
        return AsyncOAuth2Client(
            client_id=self.client_id,
            client_secret=self._client_secret,
            token_endpoint_auth_method="client_secret_basic" if self._client_secret else "none",
            redirect_uri=self.redirect_uri,
            code_challenge_method="S256",
            timeout=HTTP_TIMEOUT,
        )

    async def _exchange(self, meta: IdpMetadata, code: str, code_verifier: str, record: VerificationRecord) -> str:
        async with self._client() as client:
            try:
                token = await client.fetch_token(
                    meta.token_endpoint, grant_type="authorization_code", code=code, code_verifier=code_verifier
                )
            except OAuthError as exc:
                error = exc.error if isinstance(exc.error, str) and _ERROR_CODE.fullmatch(exc.error) else "error"
                raise self._refused("idp_token_error", "idp_error", record, {"error": error}) from None
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:  # an unreadable token response
                detail = {"error": type(exc).__name__}
                raise self._refused("idp_token_error", "idp_error", record, detail) from None
        id_token = token.get("id_token") if isinstance(token, dict) else None
        if not isinstance(id_token, str) or not id_token:
            raise self._refused("id_token_invalid", "id_token_invalid", record, {"reason": "missing"})
        return id_token

    async def _validate(self, meta: IdpMetadata, id_token: str, record: VerificationRecord) -> dict[str, Any]:
        """The ID token's claims, after every check; raises FlowRefused naming the failed check."""
        algorithms = [a for a in meta.algorithms if a in ALLOWED_ALGORITHMS]
        try:
            try:
                token = jwt.decode(id_token, await self._key_set(record), algorithms=algorithms)
            except InvalidKeyIdError:  # the provider may have rotated its keys: fetch them again, once
                token = jwt.decode(id_token, await self._key_set(record, refresh=True), algorithms=algorithms)
        except BadSignatureError:
            raise self._token_refused(record, "signature") from None
        except InvalidKeyIdError:
            raise self._token_refused(record, "unknown_key") from None
        except JoseError as exc:
            raise self._token_refused(record, f"malformed:{exc.error}") from None
        except ValueError:
            raise self._token_refused(record, "malformed") from None
        claims = token.claims
        if record.nonce is None:  # pragma: no cover - every oidc verification row has one
            raise self._token_refused(record, "nonce")
        now = int(self.ctx.now().timestamp())
        registry = JWTClaimsRegistry(
            now=now,
            leeway=self.leeway,
            iss={"essential": True, "value": meta.issuer},
            sub={"essential": True},
            aud={"essential": True, "value": self.client_id},
            exp={"essential": True},
            iat={"essential": True},
            nonce={"essential": True, "value": record.nonce},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise self._token_refused(record, "exp") from None
        except MissingClaimError as exc:
            raise self._token_refused(record, f"missing:{exc.claim}") from None
        except InvalidClaimError as exc:
            raise self._token_refused(record, exc.claim) from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        azp = claims.get("azp")
        if (len(audiences) > 1 or azp is not None) and azp != self.client_id:
            raise self._token_refused(record, "azp")
        if claims["iat"] < record.created_at.timestamp() - self.leeway:  # issued before this sign-in began
            raise self._token_refused(record, "iat")
        if not isinstance(claims["sub"], str) or not claims["sub"] or len(claims["sub"]) > 512:
            raise self._token_refused(record, "sub")
        return claims

    async def _require_metadata(self, elicitation_id: str) -> IdpMetadata:
        try:
            return await self._get_metadata()
        except _Unavailable as exc:
            log.warning("identity provider unavailable: %s", exc)
            raise FlowRefused(
                "idp_unavailable",
                event="idp_unavailable",
                elicitation_id=elicitation_id,
                audit={"identity_verifier": self.name, "reason": str(exc)},
            ) from None

    async def _get_metadata(self) -> IdpMetadata:
        async with self._lock:
            if self._metadata is not None and time.monotonic() - self._metadata_at < METADATA_TTL_SECONDS:
                return self._metadata
            document = await self._get_json(self.discovery_url, "discovery document")
            issuer = document.get("issuer")
            if not isinstance(issuer, str) or not issuer:
                raise _Unavailable("discovery document has no issuer")
            # OpenID Connect Discovery 1.0 section 4.3: the issuer must be the one the document was fetched for.
            if self.discovery_url.endswith(DISCOVERY_SUFFIX) and (
                issuer.rstrip("/") != self.discovery_url.removesuffix(DISCOVERY_SUFFIX).rstrip("/")
            ):
                raise _Unavailable("discovery document names another issuer")
            algorithms = document.get("id_token_signing_alg_values_supported") or ["RS256"]
            self._metadata = IdpMetadata(
                issuer=issuer,
                authorization_endpoint=_checked_url(document, "authorization_endpoint"),
                token_endpoint=_checked_url(document, "token_endpoint"),
                jwks_uri=_checked_url(document, "jwks_uri"),
                algorithms=tuple(a for a in algorithms if isinstance(a, str)),
                iss_parameter_supported=document.get("authorization_response_iss_parameter_supported") is True,
            )
            self._metadata_at = time.monotonic()
            return self._metadata

    async def _key_set(self, record: VerificationRecord, *, refresh: bool = False) -> KeySet:
        meta = await self._require_metadata(record.elicitation_id)
        async with self._lock:
            stale = self._keys is None or time.monotonic() - self._keys_at >= METADATA_TTL_SECONDS
            may_refresh = refresh and time.monotonic() - self._keys_at >= JWKS_REFRESH_MIN_SECONDS
            if stale or may_refresh:
                try:
                    document = await self._get_json(meta.jwks_uri, "JWKS")
                    self._keys = KeySet.import_key_set(document)  # type: ignore[arg-type]
                except (_Unavailable, JoseError, ValueError, TypeError, KeyError, AttributeError) as exc:
                    log.warning("identity provider keys unavailable: %s", type(exc).__name__)
                    if self._keys is None:
                        detail = {"reason": "jwks"}
                        raise self._refused("idp_unavailable", "idp_unavailable", record, detail) from None
                self._keys_at = time.monotonic()
            assert self._keys is not None
            return self._keys

    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self.ctx.http.get(url, headers={"Accept": "application/json"}, timeout=HTTP_TIMEOUT)
            response.raise_for_status()
            document = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise _Unavailable(f"{what} could not be fetched ({type(exc).__name__})") from None
        if not isinstance(document, dict):
            raise _Unavailable(f"{what} is not a JSON object")
        return document

    # -- refusals -------------------------------------------------------------------------------------------
    def _refused(self, code: str, event: str, record: VerificationRecord, detail: dict[str, Any]) -> FlowRefused:
        return FlowRefused(
            code,
            event=event,
            elicitation_id=record.elicitation_id,
            audit={"identity_verifier": self.name, **detail},
        )

    def _token_refused(self, record: VerificationRecord, reason: str) -> FlowRefused:
        return FlowRefused(
            "id_token_invalid",
            event="id_token_invalid",
            elicitation_id=record.elicitation_id,
            audit={"identity_verifier": self.name, "reason": reason[:64]},
        )

    # -- routes ---------------------------------------------------------------------------------------------
    def routes(self, kit: RouteKit) -> VerifierRoutes:
        async def callback(request: Request) -> Response:
            """`GET /identity/oidc/callback`: the identity provider sends the browser back here."""
            binding = kit.binding(request)
            async with kit.step.refusals():
                back = await self.complete(dict(request.query_params.items()), binding)
            assert binding is not None  # claim_for_browser checked it
            return kit.redirect(await kit.step.continue_after(back, binding))

        return VerifierRoutes(browser=[VerifierRoute("/callback", callback)])


class OidcPlugin:
    name = "oidc"
    settings_model = OidcSettings

    def build(self, ctx: VerifierContext, settings: OidcSettings) -> OidcVerifier:
        if not settings.discovery_url:
            raise ctx.settings.config_error(
                ("identity", "oidc", "discovery_url"),
                "the oidc verifier needs the identity provider's discovery URL "
                "(https://.../.well-known/openid-configuration)",
            )
        if not settings.client_id:
            raise ctx.settings.config_error(
                ("identity", "oidc", "client_id"), "the oidc verifier needs its client id at the identity provider"
            )
        return OidcVerifier(ctx, settings)
