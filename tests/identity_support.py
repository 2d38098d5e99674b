"""Helpers for the identity-verifier tests: a real OpenID Connect IdP on its own loopback server, a connector
deployed with chosen settings, and an elicitation started over real ACP.

The IdP (`LoopbackIdP`) is a small Starlette app served by uvicorn: discovery, an authorization endpoint that
signs in whichever user the test says is logged in there, a token endpoint that checks the code, the redirect
URI and the PKCE verifier, and a JWKS endpoint. ID tokens are signed with a real RSA key. A test spoils one
thing at a time: `claims` (replace a claim, `None` removes it), `signer` (a key the JWKS does not hold),
`header` (extra JOSE header fields).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from joserfc import jwt
from joserfc.jwk import RSAKey
from sqlalchemy import func, select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from service import ElicitationStatus, Identity
from service.store.tables import identity_verifications, oauth_flows
from service.web.server import listening_socket, serving

from .acp_peers import RecordingClient, Wire, connect, prompt_text
from .conftest import Deployment
from .conftest import deploy as deploy  # re-exported: identity tests used to import it from here

CLIENT_ID = "connector-at-idp"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


@dataclass
class _Code:
    user: str
    nonce: str | None
    challenge: str | None
    method: str | None
    redirect_uri: str
    used: bool = False


@functools.cache
def idp_key() -> RSAKey:
    """The IdP's RSA key, made once per test process (generating one costs more than most tests)."""
    return RSAKey.generate_key(2048, parameters={"kid": "idp-key-1", "alg": "RS256"})


@functools.cache
def oidc_provider_key() -> RSAKey:
    """The signing key of the tests' MockOIDCProvider, made once per test process."""
    return RSAKey.generate_key(2048, parameters={"kid": "mock-key-1", "use": "sig", "alg": "RS256"})


@dataclass
class LoopbackIdP:
    """The operator's identity provider, as the test scripts it."""

    client_id: str = CLIENT_ID
    client_secret: str | None = None
    logged_in: str = "alice"  # the user the browser is signed in as at the IdP
    key: RSAKey = field(default_factory=lambda: idp_key())
    claims: dict[str, Any] = field(default_factory=dict)
    header: dict[str, Any] = field(default_factory=dict)
    signer: RSAKey | None = None
    unsigned: bool = False  # alg "none", no signature: a token anyone could write
    token_answer: tuple[int, str] | None = None  # answer the token request with this (status, body) instead
    deny: str | None = None  # answer the next authorization request with this error
    send_iss: bool = False  # RFC 9207 `iss` on the authorization response (and advertise it)
    iss_override: str | None = None  # the `iss` sent on the authorization response
    base_url: str = ""
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    token_requests: list[dict[str, str]] = field(default_factory=list)
    issued_id_tokens: list[str] = field(default_factory=list)
    _codes: dict[str, _Code] = field(default_factory=dict)

    @property
    def issuer(self) -> str:
        return self.base_url

    @property
    def discovery_url(self) -> str:
        return f"{self.base_url}/.well-known/openid-configuration"

    def identity(self, user: str) -> Identity:
        return Identity(self.issuer, user)

    def secrets_seen(self) -> list[str]:
        """Codes, PKCE verifiers and ID tokens that crossed this IdP: none may appear anywhere we write."""
        verifiers = [r["code_verifier"] for r in self.token_requests if "code_verifier" in r]
        return [*self._codes, *verifiers, *self.issued_id_tokens]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
                Route("/jwks", self._jwks),
            ]
        )

    async def _discovery(self, request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.base_url}/authorize",
                "token_endpoint": f"{self.base_url}/token",
                "jwks_uri": f"{self.base_url}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "authorization_response_iss_parameter_supported": self.send_iss,
            }
        )

    async def _jwks(self, request: Request) -> Response:
        return JSONResponse({"keys": [self.key.as_dict(private=False)]})

    async def _authorize(self, request: Request) -> Response:
        q = dict(request.query_params.items())
        self.authorize_requests.append(q)
        if q.get("client_id") != self.client_id or not q.get("redirect_uri"):
            return PlainTextResponse("unknown client", 400)
        back: dict[str, str] = {"state": q.get("state", "")}
        if self.send_iss:
            back["iss"] = self.iss_override or self.issuer
        if self.deny is not None:
            back["error"], self.deny = self.deny, None
        else:
            code = "idp_code_" + secrets.token_urlsafe(24)
            self._codes[code] = _Code(
                self.logged_in,
                q.get("nonce"),
                q.get("code_challenge"),
                q.get("code_challenge_method"),
                q["redirect_uri"],
            )
            back["code"] = code
        return RedirectResponse(f"{q['redirect_uri']}?{urlencode(back)}", status_code=302)

    async def _token(self, request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        self.token_requests.append(form)
        if self.token_answer is not None:
            return Response(self.token_answer[1], self.token_answer[0], media_type="application/json")
        if self.client_secret is not None:
            expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
            if request.headers.get("authorization") != f"Basic {expected}":
                return JSONResponse({"error": "invalid_client"}, 401)
        elif form.get("client_id") != self.client_id:
            return JSONResponse({"error": "invalid_client"}, 401)
        issued = self._codes.get(form.get("code", ""))
        if issued is None or issued.used or form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "invalid_grant"}, 400)
        issued.used = True
        if form.get("redirect_uri") != issued.redirect_uri:
            return JSONResponse({"error": "invalid_grant", "error_description": "redirect_uri"}, 400)
        if issued.method != "S256" or issued.challenge != _s256(form.get("code_verifier", "")):
            return JSONResponse({"error": "invalid_grant", "error_description": "PKCE"}, 400)
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": issued.user,
            "aud": self.client_id,
            "exp": now + 300,
            "iat": now,
            "nonce": issued.nonce,
        }
        for name, value in self.claims.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        signer = self.signer or self.key
        header = {"alg": "RS256", "kid": signer.kid, **self.header}
        if self.unsigned:
            id_token = ".".join(_b64(json.dumps(part).encode()) for part in ({**header, "alg": "none"}, claims)) + "."
        else:
            id_token = jwt.encode(header, claims, signer)
        self.issued_id_tokens.append(id_token)
        return JSONResponse(
            {"access_token": "idp_at_" + secrets.token_urlsafe(16), "token_type": "Bearer", "id_token": id_token}
        )


@asynccontextmanager
async def serve_idp(idp: LoopbackIdP) -> AsyncIterator[LoopbackIdP]:
    """Serve the IdP on its own loopback port until the block ends."""
    with listening_socket("127.0.0.1", 0) as sock:
        idp.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with serving(idp.app(), sock):
            yield idp


@dataclass
class Started:
    """An elicitation the agent is waiting on (bound to `user`), with its connect URL."""

    wire: Wire
    task: asyncio.Task[Any]
    url: str
    elicitation_id: str
    user: Identity

    async def close(self) -> None:
        if not self.task.done():
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.wire.close()


@asynccontextmanager
async def started(deployment: Deployment, user: Identity) -> AsyncIterator[Started]:
    """The agent asks for GitHub access for `user` over a real ACP connection; the client accepts."""
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, user, client)
    task = asyncio.create_task(wire.client_conn.prompt(session_id="sess-1", prompt=prompt_text("list my repos")))
    url = await asyncio.wait_for(client.urls.get(), 10)
    pending = Started(wire, task, url, url.rsplit("/", 1)[1], user)
    try:
        yield pending
    finally:
        await pending.close()


async def wait_status(deployment: Deployment, elicitation_id: str, *statuses: ElicitationStatus) -> None:
    """Wait until the client's accept was processed (or the elicitation reached one of `statuses`)."""
    store = deployment.connector.runtime.store
    for _ in range(200):
        record = await store.elicitations.get(elicitation_id)
        if record is not None and record.status in statuses:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"elicitation never reached {statuses}")


async def assert_nothing_happened(deployment: Deployment, started_: Started) -> None:
    """Refused: no grant, no provider redirect (no OAuth flow row), no code issued, nothing completed."""
    connector = deployment.connector
    store = connector.runtime.store
    record = await store.elicitations.get(started_.elicitation_id)
    assert record is not None
    assert record.status in (ElicitationStatus.PENDING, ElicitationStatus.CONSENTED), record.status
    assert await store.grants.find(started_.user, "github") == []
    assert await count_rows(deployment, oauth_flows, started_.elicitation_id) == 0
    assert deployment.provider.issued_codes == []
    assert started_.wire.received("elicitation/complete") == []
    assert not started_.task.done()


async def count_rows(deployment: Deployment, table: Any, elicitation_id: str) -> int:
    async with deployment.connector.runtime.store.engine.connect() as conn:
        statement = select(func.count()).select_from(table).where(table.c.elicitation_id == elicitation_id)
        return int((await conn.execute(statement)).scalar_one())


async def events(deployment: Deployment, elicitation_id: str | None = None) -> list[str]:
    return [e.event for e in await deployment.connector.runtime.store.audit.list(elicitation_id=elicitation_id)]


async def last_event(deployment: Deployment, event: str) -> Any:
    found = await deployment.connector.runtime.store.audit.list(event=event)
    assert found, f"no {event} audit event"
    return found[-1]


@contextmanager
def logging_restored() -> Iterator[None]:
    """`acp-connector` configures the root logger on stderr (pytest's capture stream): undo that afterwards."""
    names = ("", "httpx", "alembic", "service.audit", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = [
        (logger, list(logger.handlers), logger.level, logger.propagate)
        for logger in (logging.getLogger(n) for n in names)
    ]
    try:
        yield
    finally:
        for logger, handlers, level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def page_reveals_no_identity(text: str, *identities: Identity) -> bool:
    """The refusal page names nobody: neither subject nor issuer of any identity involved."""
    return not any(part in text for identity in identities for part in (identity.subject, identity.issuer))


__all__ = [
    "CLIENT_ID",
    "LoopbackIdP",
    "Started",
    "assert_nothing_happened",
    "count_rows",
    "deploy",
    "events",
    "identity_verifications",
    "last_event",
    "logging_restored",
    "page_reveals_no_identity",
    "serve_idp",
    "started",
    "wait_status",
]
