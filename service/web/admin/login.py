"""The operators' OIDC sign-in: authorization code with PKCE, state and nonce at the operators' identity provider
(`admin.oidc_*`), the ID token checked in full by `service.oauth` (the same code as the `oidc` identity verifier and
the connected providers), then the allowed-users / allowed-groups check. What the sign-in must remember (state,
PKCE verifier, nonce, start) travels in a cookie encrypted by the vault, bound to this purpose; nothing is stored."""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ...config import AdminSettings
from ...core.errors import ConnectorError, FlowRefused, ProviderError, VaultError
from ...oauth import EndpointError, IdTokenError, IdTokenExpectations, ProviderGateway, ResolvedProvider
from ...providers import ProviderEntry
from ...store import Store
from ...util.clock import Clock
from ...vault import Vault
from .session import OperatorAuth

log = logging.getLogger("service.web.admin")

GATEWAY_NAME = "@admin.oidc"
CALLBACK_PATH = "/admin/login/callback"
LOGIN_AAD = b"admin-login"
LOGIN_SECONDS = 600
LEEWAY_SECONDS = 60


def allowed(settings: AdminSettings, claims: Mapping[str, Any]) -> bool:
    """Whether the signed-in person is an operator: their `sub` or verified e-mail in allowed_users, or one of
    their groups in allowed_groups."""
    users = set(settings.allowed_users)
    if str(claims.get("sub")) in users:
        return True
    email = claims.get("email")
    if isinstance(email, str) and claims.get("email_verified") is True and email in users:
        return True
    groups = claims.get(settings.groups_claim)
    if isinstance(groups, str):
        groups = [groups]
    return isinstance(groups, list) and any(isinstance(g, str) and g in settings.allowed_groups for g in groups)


def operator_name(claims: Mapping[str, Any]) -> str:
    email = claims.get("email")
    if isinstance(email, str) and claims.get("email_verified") is True:
        return email
    return str(claims["sub"])


class OperatorLogin:
    def __init__(
        self,
        settings: AdminSettings,
        base_url: str,
        gateway: ProviderGateway,
        vault: Vault,
        store: Store,
        auth: OperatorAuth,
        clock: Clock,
    ) -> None:
        assert settings.oidc_discovery_url is not None and settings.oidc_client_id is not None
        self.settings = settings
        self.gateway = gateway
        self.vault = vault
        self.store = store
        self.auth = auth
        self.clock = clock
        self.redirect_uri = base_url + CALLBACK_PATH
        self.entry = ProviderEntry(
            name=GATEWAY_NAME,
            discovery_url=settings.oidc_discovery_url,
            oidc=True,
            pkce=True,
            client_id=settings.oidc_client_id,
            client_secret=settings.oidc_client_secret,
            token_endpoint_auth_method=None if settings.oidc_client_secret is not None else "none",
        )
        self.scopes = ["openid", *(s for s in settings.oidc_scopes if s != "openid")]
        self.cookie = "__Host-connector-admin-login" if auth.secure else "connector-admin-login"

    async def _provider(self) -> ResolvedProvider:
        try:
            return await self.gateway.resolve_entry(self.entry)
        except ConnectorError as exc:
            log.warning("the operators' identity provider is unavailable: %s", exc)
            raise FlowRefused("idp_unavailable") from None

    async def start(self, request: Request) -> Response:
        """`GET /admin/login`: off to the identity provider."""
        provider = await self._provider()
        try:
            sign_in = await self.gateway.authorization_request(
                provider, redirect_uri=self.redirect_uri, scopes=self.scopes
            )
        except ConnectorError as exc:  # a pushed authorization request (PAR) refused or failed
            log.warning("the operators' identity provider refused the sign-in request: %s", exc)
            raise FlowRefused("idp_unavailable") from None
        memo = {"state": sign_in.state, "verifier": sign_in.code_verifier, "nonce": sign_in.nonce, "at": time.time()}
        key_id, blob = self.vault.encrypt_json(memo, aad=LOGIN_AAD)
        response = RedirectResponse(sign_in.url, status_code=303)
        value = f"{key_id}.{base64.urlsafe_b64encode(blob).decode()}"
        response.set_cookie(
            self.cookie, value, max_age=LOGIN_SECONDS, path="/", secure=self.auth.secure, httponly=True, samesite="lax"
        )
        return response

    def _memo(self, request: Request) -> dict[str, Any]:
        key_id, _, encoded = request.cookies.get(self.cookie, "").partition(".")
        try:
            memo = self.vault.decrypt_json(key_id, base64.urlsafe_b64decode(encoded), aad=LOGIN_AAD)
        except (VaultError, ValueError, binascii.Error):
            raise self._failed("no sign-in was started in this browser") from None
        if not isinstance(memo, dict) or time.time() - float(memo.get("at", 0)) > LOGIN_SECONDS:
            raise self._failed("the sign-in took too long")
        return memo

    def _failed(self, reason: str) -> FlowRefused:
        return FlowRefused("operator_sign_in_failed", detail={"reason": reason})

    async def callback(self, request: Request) -> Response:
        """`GET /admin/login/callback`: the identity provider sent the browser back."""
        params = dict(request.query_params.items())
        memo = self._memo(request)
        if not hmac.compare_digest(str(memo.get("state")), params.get("state", "")):
            raise self._failed("the answer does not match the sign-in started here")
        provider = await self._provider()
        if not self.gateway.issuer_acceptable(provider, provider.issuer, params.get("iss")):
            raise self._failed("the answer names another issuer")
        if "error" in params or not params.get("code"):
            raise self._failed("the identity provider did not sign you in")
        claims = await self._claims(provider, params["code"], memo)
        name = operator_name(claims)
        who = {"operator": name, "issuer": str(claims.get("iss")), "subject": str(claims.get("sub"))}
        if not allowed(self.settings, claims):
            await self.store.audit.record("operator_sign_in_refused", detail=who, now=self.clock())
            raise FlowRefused("operator_not_allowed")
        await self.store.audit.record("operator_signed_in", detail=who, now=self.clock())
        response = RedirectResponse("/admin", status_code=303)
        self.auth.start(response, name)
        response.delete_cookie(self.cookie, path="/", secure=self.auth.secure, httponly=True, samesite="lax")
        return response

    async def _claims(self, provider: ResolvedProvider, code: str, memo: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        try:
            tokens = await self.gateway.exchange_code(
                provider, redirect_uri=self.redirect_uri, code=code, code_verifier=str(memo["verifier"]), now=now
            )
            assert provider.issuer is not None
            expect = IdTokenExpectations(
                issuer=provider.issuer,
                nonce=str(memo["nonce"]),
                issued_after=float(memo["at"]),
                leeway=LEEWAY_SECONDS,
            )
            claims = await self.gateway.validate_id_token(provider, tokens.id_token, expect, now=now)
            if self.settings.groups_claim not in claims or "email" not in claims:
                profile = await self.gateway.profile(provider, tokens, claims)
                claims = {**profile, **claims}
        except IdTokenError as exc:
            raise self._failed(f"the ID token failed a check: {exc.check[:64]}") from None
        except (EndpointError, ProviderError) as exc:
            log.warning("operator sign-in: %s", exc)
            raise self._failed("the identity provider's answer could not be redeemed") from None
        return claims
