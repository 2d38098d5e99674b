"""The `oidc` identity verifier: the browser signs in at the operator's OpenID Connect identity provider.

It trusts the identity provider named by `identity.oidc.discovery_url`, and only what it signed: the browser is
sent there with an authorization-code request (PKCE S256, single-use state, nonce); the ID token that comes back
through the token endpoint must carry a valid signature by a key from the provider's JWKS, the provider's
`iss`, our client id in `aud` (and `azp`), an unexpired `exp`, an `iat` not before the sign-in started, and our
nonce. The browser's identity is then (`iss`, `sub`).

The protocol is `service.oauth`'s, the same as for connected providers: discovery (cached), client
authentication (`token_endpoint_auth_method`, else from the discovery document), the token endpoint and the one
ID-token check; this module keeps the verification rows and turns failures into refusals.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from service.config import optional_secret
from service.core.errors import ConnectorError, FlowRefused, ProviderError, VaultError
from service.core.handles import handle_hash, verification_aad
from service.core.identity import Identity
from service.core.records import VerificationRecord
from service.core.urls import origin
from service.core.verification import RedirectFirst, Returned, VerificationAttempt
from service.providers import ProviderEntry, TokenEndpointAuthMethod

from .base import (
    EmptyIsNone,
    OptionalText,
    OptionalUrl,
    RouteKit,
    VerifierContext,
    VerifierRoute,
    VerifierRoutes,
    VerifierSettings,
    claim_for_browser,
    insert_verification,
    own_verification,
)

if TYPE_CHECKING:  # the OAuth client and the web stack only when a sign-in runs, not to read the settings
    from starlette.requests import Request
    from starlette.responses import Response

    from service.oauth import ProviderGateway, ResolvedProvider

log = logging.getLogger("service.identity.oidc")

CALLBACK_PATH = "/identity/oidc/callback"
# The gateway knows the identity provider under this name; no catalog name can take it (they start with a letter).
GATEWAY_NAME = "@identity.oidc"
_ERROR_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class OidcSettings(VerifierSettings):
    """`[identity.oidc]`: the operator's OpenID Connect identity provider (authorization code + PKCE)."""

    discovery_url: OptionalUrl = None
    """The identity provider's discovery document (.../.well-known/openid-configuration; https unless loopback).
    Register <public_base_url>/identity/oidc/callback there."""
    client_id: OptionalText = None
    """The connector's client id at the identity provider."""
    client_secret: SecretStr | None = None
    """Its client secret, from the environment only; unset: a public client (PKCE only)."""
    token_endpoint_auth_method: Annotated[TokenEndpointAuthMethod | None, EmptyIsNone] = None
    """How the client authenticates at the token endpoint; unset: client_secret_basic or client_secret_post as the
    discovery document lists them, or none (PKCE only) without a secret."""
    scopes: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["openid"])
    """Scopes requested at sign-in; openid is always included."""
    leeway_seconds: int = Field(default=60, ge=0, le=600)
    """Clock skew allowed when checking the ID token's exp and iat."""

    @field_validator("client_secret", mode="before")
    @classmethod
    def _empty_secret_is_none(cls, value: Any) -> Any:
        return optional_secret(value)

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
        self.providers: ProviderGateway = ctx.providers
        method = settings.token_endpoint_auth_method
        if method is None and settings.client_secret is None:
            method = "none"  # a public client: PKCE is its proof
        self.entry = ProviderEntry(
            name=GATEWAY_NAME,
            discovery_url=settings.discovery_url,
            oidc=True,
            pkce=True,
            client_id=settings.client_id,
            client_secret=settings.client_secret,
            token_endpoint_auth_method=method,
        )
        self.scopes = ["openid", *(s for s in settings.scopes if s != "openid")]
        self.leeway = settings.leeway_seconds
        self.redirect_uri = f"{ctx.flow.public_base_url}{CALLBACK_PATH}"

    # -- the verifier -------------------------------------------------------------------------------------
    async def begin(self, attempt: VerificationAttempt) -> RedirectFirst:
        record = attempt.elicitation
        provider = await self._provider(record.id)
        try:
            request = await self.providers.authorization_request(
                provider, redirect_uri=self.redirect_uri, scopes=self.scopes
            )
        except ConnectorError as exc:  # a pushed authorization request (PAR) refused or failed
            log.warning("identity provider refused the pushed authorization request: %s", exc)
            raise FlowRefused(
                "idp_unavailable",
                event="idp_unavailable",
                elicitation_id=record.id,
                audit={"identity_verifier": self.name, "reason": str(exc)},
            ) from None
        assert request.code_verifier is not None and request.nonce is not None
        verification_id = secrets.token_urlsafe(16)
        key_id, blob = self.ctx.vault.encrypt(request.code_verifier.encode(), aad=verification_aad(verification_id))
        await insert_verification(
            self.ctx,
            attempt,
            verification_id=verification_id,
            verifier=self.name,
            handle_hash=handle_hash("oidc-state", request.state),
            nonce=request.nonce,
            pkce_key_id=key_id,
            pkce_ciphertext=blob,
        )
        return RedirectFirst(request.url, verification_id)

    async def complete(self, params: dict[str, str], browser_binding: str | None) -> Returned:
        """The identity provider sent the browser back: check everything, return who signed in."""
        state = params.get("state")
        record = None
        if state:
            record = await self.ctx.store.verifications.get_by_handle(handle_hash("oidc-state", state))
        record = own_verification(record, self.name)
        record = await claim_for_browser(self.ctx, record, browser_binding, verifier=self.name)
        provider = await self._provider(record.elicitation_id)
        if not self.providers.issuer_acceptable(provider, provider.issuer, params.get("iss")):
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
        claims = await self._signed_in(provider, code, code_verifier, record)
        return Returned(record.elicitation_id, Identity(claims["iss"], claims["sub"]), record.id, intent=record.intent)

    async def form_targets(self) -> list[str]:
        try:
            provider = await self.providers.resolve_entry(self.entry)
        except ConnectorError:
            return []
        return [origin(provider.authorization_endpoint)]

    # -- the identity provider ------------------------------------------------------------------------------
    async def _provider(self, elicitation_id: str) -> ResolvedProvider:
        try:
            return await self.providers.resolve_entry(self.entry)
        except ConnectorError as exc:
            log.warning("identity provider unavailable: %s", exc)
            raise FlowRefused(
                "idp_unavailable",
                event="idp_unavailable",
                elicitation_id=elicitation_id,
                audit={"identity_verifier": self.name, "reason": str(exc)},
            ) from None

    async def _signed_in(
        self, provider: ResolvedProvider, code: str, code_verifier: str, record: VerificationRecord
    ) -> dict[str, Any]:
        """Redeem the code and check the ID token in full; its claims, or a refusal naming what failed."""
        from service.oauth import EndpointError, IdTokenError, IdTokenExpectations

        now = self.ctx.now()
        try:
            tokens = await self.providers.exchange_code(
                provider, redirect_uri=self.redirect_uri, code=code, code_verifier=code_verifier, now=now
            )
        except EndpointError as exc:
            error = exc.error or (f"HTTP {exc.status}" if exc.status is not None else "unreachable")
            raise self._refused("idp_token_error", "idp_error", record, {"error": error}) from None
        except ProviderError as exc:  # an unreadable token response
            raise self._refused("idp_token_error", "idp_error", record, {"error": exc.code}) from None
        assert record.nonce is not None and provider.issuer is not None  # every oidc row has a nonce
        expect = IdTokenExpectations(
            issuer=provider.issuer,
            nonce=record.nonce,
            issued_after=record.created_at.timestamp(),
            leeway=self.leeway,
        )
        try:
            return await self.providers.validate_id_token(provider, tokens.id_token, expect, now=now)
        except IdTokenError as exc:
            raise self._token_refused(record, exc.check) from None
        except ProviderError:  # its keys could not be read
            raise self._refused("idp_unavailable", "idp_unavailable", record, {"reason": "jwks"}) from None

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
