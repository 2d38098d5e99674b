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
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..config import Settings
from ..errors import ConfigError
from ..runtime import Runtime
from ..store import VerificationRecord
from . import Identity
from .base import (
    IdentityVerifier,
    RedirectFirst,
    Returned,
    VerificationAttempt,
    VerificationRefused,
    claim_for_browser,
    handle_hash,
    insert_verification,
)

CONFIRM_PATH = "/v1/identity/confirm"
RETURN_PATH = "/identity/confirm/return"
_HANDLE = re.compile(r"[A-Za-z0-9_\-]{20,128}")
MAX_USER_ID_LENGTH = 512


class ConfirmVerifier(IdentityVerifier):
    name = "confirm"

    def __init__(self, runtime: Runtime, operator_url: str, issuer: str, api_key_hashes: list[str]) -> None:
        self.rt = runtime
        self.operator_url = operator_url
        self.issuer = issuer
        self._api_key_hashes = tuple(api_key_hashes)

    @classmethod
    def from_settings(cls, runtime: Runtime, settings: Settings | None = None) -> ConfirmVerifier:
        settings = settings or runtime.settings
        where = str(settings.config_file or "environment")
        section = settings.identity.confirm
        if not section.operator_url:
            raise ConfigError(
                where,
                "identity.confirm.operator_url",
                "the confirm verifier needs the operator app's URL the browser is sent to (it gets ?flow_id=...)",
            )
        if not section.issuer:
            raise ConfigError(
                where,
                "identity.confirm.issuer",
                "the confirm verifier needs the issuer the operator's user ids belong to (as Identity.issuer)",
            )
        if not section.api_key_hashes:
            raise ConfigError(
                where,
                "identity.confirm.api_key_hashes",
                "the confirm verifier needs at least one operator API key, given as its SHA-256 hex digest",
            )
        return cls(runtime, section.operator_url, section.issuer, section.api_key_hashes)

    # -- the browser leaves ------------------------------------------------------------------------------
    async def begin(self, attempt: VerificationAttempt) -> RedirectFirst:
        flow_id = secrets.token_urlsafe(32)
        verification_id = secrets.token_urlsafe(16)
        await insert_verification(
            self.rt,
            attempt,
            verification_id=verification_id,
            verifier=self.name,
            handle_hash=handle_hash("confirm-flow", flow_id),
        )
        parts = urlsplit(self.operator_url)
        query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), ("flow_id", flow_id)])
        return RedirectFirst(urlunsplit(parts._replace(query=query)), verification_id)

    async def form_targets(self) -> list[str]:
        parts = urlsplit(self.operator_url)
        return [f"{parts.scheme}://{parts.netloc}"]

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
            raise ValueError("user_id must be a non-empty printable string of at most 512 characters")
        return Identity(self.issuer, user_id)

    async def lookup(self, flow_id: str) -> VerificationRecord:
        """The open hand-off for `flow_id`; VerificationRefused (with an API status) when there is none."""
        record = None
        if _HANDLE.fullmatch(flow_id):
            record = await self.rt.store.verifications.get_by_handle(handle_hash("confirm-flow", flow_id))
        if record is None or record.verifier != self.name:
            raise VerificationRefused(
                404,
                "unknown_flow",
                "Unknown flow",
                "No hand-off with this flow id is known.",
                event="unknown_verification",
                detail={"identity_verifier": self.name, "step": "confirm"},
            )
        return record

    async def record_answer(self, record: VerificationRecord, identity: Identity, *, matched: bool) -> str:
        """Store the operator's answer once; return the code for the browser's return URL."""
        code = secrets.token_urlsafe(32)
        answered = await self.rt.store.verifications.confirm(
            record.id,
            identity=identity,
            outcome="confirmed" if matched else "mismatch",
            return_hash=handle_hash("confirm-return", code),
            now=self.rt.now(),
        )
        if answered is not None:
            return code
        if record.confirmed_at is not None or record.used_at is not None:
            raise VerificationRefused(
                409,
                "flow_used",
                "Flow already used",
                "This flow id was already confirmed; each flow id is good for one confirmation.",
                event="replay_attempt",
                elicitation_id=record.elicitation_id,
                detail={"identity_verifier": self.name, "step": "confirm"},
            )
        raise VerificationRefused(
            410,
            "flow_expired",
            "Flow expired",
            "This flow id has expired; the user must open the link from the agent again.",
            event="verification_expired",
            elicitation_id=record.elicitation_id,
            detail={"identity_verifier": self.name, "step": "confirm"},
        )

    def return_url(self, code: str) -> str:
        return f"{self.rt.settings.public_base_url}{RETURN_PATH}?{urlencode({'code': code})}"

    # -- the browser comes back ---------------------------------------------------------------------------
    async def complete(self, code: str | None, browser_binding: str | None) -> Returned:
        record = None
        if code and _HANDLE.fullmatch(code):
            record = await self.rt.store.verifications.get_by_return(handle_hash("confirm-return", code))
        if record is None or record.verifier != self.name:
            raise VerificationRefused(
                400,
                "unknown_verification",
                "Invalid request",
                "This link does not match any sign-in started here.",
                event="unknown_verification",
                detail={"identity_verifier": self.name, "step": "return"},
            )
        record = await claim_for_browser(self.rt, record, browser_binding, verifier=self.name)
        assert record.identity is not None
        return Returned(
            record.elicitation_id, record.identity, record.id, mismatch_recorded=record.outcome == "mismatch"
        )
