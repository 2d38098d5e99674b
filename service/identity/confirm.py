"""The `confirm` identity verifier: the operator's own app says who its logged-in user is (Arcade-style hand-off).

It trusts the operator's app, authenticated by an API key (configured only as SHA-256 hashes). Continue on the
consent page sends the browser to `identity.confirm.operator_url` with an opaque, single-use `flow_id`. The
operator's app identifies its own logged-in user and calls `POST /v1/identity/confirm` with the flow id and
that user's id; the answer tells it where to send the browser next (`next_uri`, carrying a second single-use
code). The browser must come back on the browser that pressed Continue; only then does it go on to the provider.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, field_validator

from service.core.errors import FlowRefused
from service.core.handles import handle_hash
from service.core.identity import Identity
from service.core.records import VerificationRecord
from service.core.urls import origin
from service.core.verification import RedirectFirst, Returned, VerificationAttempt

from .base import (
    OptionalText,
    OptionalUrl,
    RouteKit,
    TextList,
    VerifierContext,
    VerifierRoute,
    VerifierRoutes,
    VerifierSettings,
    claim_for_browser,
    insert_verification,
    own_verification,
)

if TYPE_CHECKING:  # the routes get these from the web layer; the CLI's configuration checks import no web stack
    from starlette.requests import Request
    from starlette.responses import Response

RETURN_PATH = "/identity/confirm/return"
_HANDLE = re.compile(r"[A-Za-z0-9_\-]{20,128}")
MAX_USER_ID_LENGTH = 512


class ConfirmSettings(VerifierSettings):
    """`[identity.confirm]`: the operator's own app confirms its logged-in user over an authenticated call."""

    operator_url: OptionalUrl = None
    """Where Continue sends the browser: a page of your app, which gets ?flow_id=<id> and confirms its logged-in user
    with POST /v1/identity/confirm."""
    issuer: OptionalText = None
    """The issuer your app's user ids belong to (what the agent reports as Identity.issuer)."""
    api_key_hashes: TextList = Field(default_factory=list)
    """SHA-256 hex digests of the API keys your app may use (never the keys); several allow rotation. In the
    environment: comma-separated."""

    @field_validator("api_key_hashes")
    @classmethod
    def _check_hashes(cls, value: list[str]) -> list[str]:
        checked = []
        for index, entry in enumerate(value):
            digest = entry.strip().lower().removeprefix("sha256:")
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"entry {index} is not a SHA-256 hex digest (64 hex characters)")
            checked.append(digest)
        return checked


class ConfirmVerifier:
    name = "confirm"

    def __init__(self, ctx: VerifierContext, operator_url: str, issuer: str, api_key_hashes: list[str]) -> None:
        self.ctx = ctx
        self.operator_url = operator_url
        self.issuer = issuer
        self._api_key_hashes = tuple(api_key_hashes)

    # -- the browser leaves ------------------------------------------------------------------------------
    async def begin(self, attempt: VerificationAttempt) -> RedirectFirst:
        flow_id = secrets.token_urlsafe(32)
        verification_id = secrets.token_urlsafe(16)
        await insert_verification(
            self.ctx,
            attempt,
            verification_id=verification_id,
            verifier=self.name,
            handle_hash=handle_hash("confirm-flow", flow_id),
        )
        parts = urlsplit(self.operator_url)
        query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), ("flow_id", flow_id)])
        return RedirectFirst(urlunsplit(parts._replace(query=query)), verification_id)

    async def form_targets(self) -> list[str]:
        return [origin(self.operator_url)]

    # -- the operator's app calls -------------------------------------------------------------------------
    def authenticate(self, authorization: str | None) -> bool:
        """True when the `Authorization: Bearer <key>` header carries a configured operator API key."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return False
        digest = hashlib.sha256(key.encode()).hexdigest()
        matched = False
        for expected in self._api_key_hashes:  # compare with every hash: the time does not say which matched
            matched |= hmac.compare_digest(digest, expected)
        return matched

    def identity_of(self, user_id: str) -> Identity:
        """The identity the operator asserts: its user id under the configured issuer."""
        if not user_id or len(user_id) > MAX_USER_ID_LENGTH or not user_id.isprintable():
            raise FlowRefused(
                "bad_request",
                detail={"problem": "user_id must be a non-empty printable string of at most 512 characters"},
            )
        return Identity(self.issuer, user_id)

    async def lookup(self, flow_id: str) -> VerificationRecord:
        """The open hand-off for `flow_id`; FlowRefused `unknown_flow` when there is none."""
        record = None
        if _HANDLE.fullmatch(flow_id):
            record = await self.ctx.store.verifications.get_by_handle(handle_hash("confirm-flow", flow_id))
        return own_verification(record, self.name, code="unknown_flow", step="confirm")

    async def record_answer(self, record: VerificationRecord, identity: Identity, *, matched: bool) -> str:
        """Store the operator's answer once; return the code for the browser's return URL."""
        code = secrets.token_urlsafe(32)
        answered = await self.ctx.store.verifications.confirm(
            record.id,
            identity=identity,
            outcome="confirmed" if matched else "mismatch",
            return_hash=handle_hash("confirm-return", code),
            now=self.ctx.now(),
        )
        if answered is not None:
            return code
        if record.confirmed_at is not None or record.used_at is not None:
            raise FlowRefused(
                "flow_used",
                event="replay_attempt",
                elicitation_id=record.elicitation_id,
                audit={"identity_verifier": self.name, "step": "confirm"},
            )
        raise FlowRefused(
            "flow_expired",
            event="verification_expired",
            elicitation_id=record.elicitation_id,
            audit={"identity_verifier": self.name, "step": "confirm"},
        )

    def return_url(self, code: str) -> str:
        return f"{self.ctx.flow.public_base_url}{RETURN_PATH}?{urlencode({'code': code})}"

    # -- the browser comes back ---------------------------------------------------------------------------
    async def complete(self, code: str | None, browser_binding: str | None) -> Returned:
        record = None
        if code and _HANDLE.fullmatch(code):
            record = await self.ctx.store.verifications.get_by_return(handle_hash("confirm-return", code))
        record = own_verification(record, self.name, step="return")
        record = await claim_for_browser(self.ctx, record, browser_binding, verifier=self.name)
        assert record.identity is not None
        return Returned(
            record.elicitation_id,
            record.identity,
            record.id,
            mismatch_recorded=record.outcome == "mismatch",
            intent=record.intent,
        )

    # -- routes ---------------------------------------------------------------------------------------------
    def routes(self, kit: RouteKit) -> VerifierRoutes:
        async def confirm(request: Request) -> Response:
            """`POST /v1/identity/confirm` {flow_id, user_id}, by the operator's app with its API key."""
            if not self.authenticate(request.headers.get("authorization")):
                await kit.step.elicitations.record_unattributed(
                    "confirm_unauthorized", detail={"peer": kit.browser(request).peer}
                )
                raise FlowRefused("unauthorized")
            body = await kit.read_json(request)
            flow_id, user_id = body.get("flow_id"), body.get("user_id")
            if set(body) != {"flow_id", "user_id"} or not isinstance(flow_id, str) or not isinstance(user_id, str):
                raise FlowRefused(
                    "bad_request", detail={"problem": 'the body must be exactly {"flow_id": "...", "user_id": "..."}'}
                )
            limited = await kit.limit(request, "confirm-flow:" + hashlib.sha256(flow_id.encode()).hexdigest())
            if limited is not None:
                return limited
            identity = self.identity_of(user_id)
            async with kit.step.refusals():
                record = await self.lookup(flow_id)
                elicitation = await kit.step.flow.open_elicitation(record.elicitation_id)
                matched = identity == elicitation.identity
                code = await self.record_answer(record, identity, matched=matched)
            next_uri = self.return_url(code)
            if matched:
                await kit.step.elicitations.audit(
                    elicitation,
                    "identity_confirmed",
                    detail={"identity_verifier": self.name, "verification_id": record.id},
                )
                return kit.json({"status": "confirmed", "next_uri": next_uri})
            # The browser's next stop shows the refusal page; this answer says nothing about whom.
            try:
                await kit.step.flow.check_identity(elicitation, identity, record.intent)
            except FlowRefused as exc:
                return kit.api_error(exc, next_uri=next_uri)
            raise AssertionError("check_identity accepted a mismatched identity")  # pragma: no cover

        async def returned(request: Request) -> Response:
            """`GET /identity/confirm/return?code=...`: the browser comes back from the operator's app."""
            binding = kit.binding(request)
            async with kit.step.refusals():
                back = await self.complete(request.query_params.get("code"), binding)
            assert binding is not None  # claim_for_browser checked it
            return kit.redirect(await kit.step.continue_after(back, binding))

        return VerifierRoutes(
            browser=[VerifierRoute("/return", returned)],
            api=[VerifierRoute("", confirm, ("POST",))],
        )


class ConfirmPlugin:
    name = "confirm"
    settings_model = ConfirmSettings

    def build(self, ctx: VerifierContext, settings: ConfirmSettings) -> ConfirmVerifier:
        config = ctx.settings
        if not settings.operator_url:
            raise config.config_error(
                ("identity", "confirm", "operator_url"),
                "the confirm verifier needs the operator app's URL the browser is sent to (it gets ?flow_id=...)",
            )
        if not settings.issuer:
            raise config.config_error(
                ("identity", "confirm", "issuer"),
                "the confirm verifier needs the issuer the operator's user ids belong to (as Identity.issuer)",
            )
        if not settings.api_key_hashes:
            raise config.config_error(
                ("identity", "confirm", "api_key_hashes"),
                "the confirm verifier needs at least one operator API key, given as its SHA-256 hex digest",
            )
        return ConfirmVerifier(ctx, settings.operator_url, settings.issuer, settings.api_key_hashes)
