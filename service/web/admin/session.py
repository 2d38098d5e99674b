"""Who is at the console: the operator API key (scripts), or an operator's signed session cookie (after the OIDC
sign-in); never an agent's `/v1` key (403). CSRF tokens for the console's forms are bound to the session."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response

from ...config import AdminSettings
from ...console import Operator
from ...core.agent_api import AgentApi
from ...core.errors import FlowRefused
from ...util.clock import Clock
from ...vault import Vault

SESSION_COOKIE_SECURE = "__Host-connector-admin"
SESSION_COOKIE_DEV = "connector-admin"
SESSION_PURPOSE = "admin-session"
CSRF_PURPOSE = "admin-csrf"
API_KEY_SESSION = "api-key"  # what the CSRF token of an API-key caller is bound to


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated operator and the session their CSRF tokens are bound to."""

    operator: Operator
    session: str


class OperatorAuth:
    def __init__(self, settings: AdminSettings, vault: Vault, agents: AgentApi, clock: Clock, *, secure: bool) -> None:
        self._key = None if settings.api_key is None else settings.api_key.get_secret_value().encode()
        self._vault = vault
        self._agents = agents
        self._clock = clock
        self._lifetime = timedelta(seconds=settings.session_seconds)
        self.secure = secure
        self.cookie = SESSION_COOKIE_SECURE if secure else SESSION_COOKIE_DEV

    async def caller(self, request: Request) -> Caller:
        """The operator making `request`; FlowRefused `operator_unauthorized` (401) or `operator_forbidden` (403,
        an agent's key)."""
        header = request.headers.get("authorization")
        if header is not None:
            return await self._bearer(header)
        session = self._session(request.cookies.get(self.cookie, ""))
        if session is None:
            raise FlowRefused("operator_unauthorized")
        return session

    async def _bearer(self, header: str) -> Caller:
        scheme, _, supplied = header.partition(" ")
        token = supplied.strip()
        if scheme.lower() != "bearer" or not token:
            raise FlowRefused("operator_unauthorized")
        if self._key is not None and hmac.compare_digest(token.encode(), self._key):
            return Caller(Operator("api-key", "api_key"), API_KEY_SESSION)
        try:
            await self._agents.authenticate(token)
        except FlowRefused:
            raise FlowRefused("operator_unauthorized") from None
        raise FlowRefused("operator_forbidden")  # a live agent key: known, and never an operator's

    # -- the session cookie: base64url(JSON {name, sid, exp}) "." signature ---------------------------------
    def start(self, response: Response, name: str) -> None:
        expires = self._clock() + self._lifetime
        payload = json.dumps({"n": name, "s": secrets.token_urlsafe(16), "e": int(expires.timestamp())})
        encoded = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=").decode()
        value = f"{encoded}.{self._vault.sign(SESSION_PURPOSE, encoded.encode())}"
        response.set_cookie(
            self.cookie,
            value,
            max_age=int(self._lifetime.total_seconds()),
            path="/",
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )

    def end(self, response: Response) -> None:
        response.delete_cookie(self.cookie, path="/", secure=self.secure, httponly=True, samesite="lax")

    def _session(self, value: str) -> Caller | None:
        encoded, _, signature = value.partition(".")
        if not encoded or len(value) > 2048 or not self._vault.verify(SESSION_PURPOSE, encoded.encode(), signature):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
            name, sid, expires = str(payload["n"]), str(payload["s"]), int(payload["e"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        if datetime.fromtimestamp(expires, self._clock().tzinfo) <= self._clock():
            return None
        return Caller(Operator(name, "oidc"), sid)

    # -- CSRF -------------------------------------------------------------------------------------------------
    def csrf_token(self, caller: Caller, action: str) -> str:
        return self._vault.sign(CSRF_PURPOSE, f"{caller.session}\x00{action}".encode())

    def csrf_valid(self, caller: Caller, action: str, token: str | None) -> bool:
        if not token:
            return False
        return self._vault.verify(CSRF_PURPOSE, f"{caller.session}\x00{action}".encode(), token)
