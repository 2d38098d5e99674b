"""The identity-verifier interface: how a deployment learns who is in the browser before it goes to a provider.

A verifier either establishes the browser's identity at once (`Verified`: local, trusted_header) or sends the
browser away first (`RedirectFirst`: oidc to the operator's identity provider, confirm to the operator's app)
and finishes on a return route (`Returned`). Whatever it concludes is compared with the identity the
elicitation was bound to by `BrowserFlow.check_identity` (called from `service.verification`); a verifier
never decides that comparison itself.

Verifier state that must survive the round trip is server-side (`store.verifications`): single-use, expiring,
bound to the browser-binding cookie, with handles stored only as hashes. Nothing the browser supplies
unauthenticated (URL, form field, header from an untrusted peer) is ever taken as identity.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from ..runtime import Runtime
from ..store import ElicitationRecord, VerificationRecord
from . import Identity

# How long the browser may spend at the identity provider or the operator's app.
VERIFICATION_TTL = timedelta(minutes=10)


def handle_hash(purpose: str, handle: str) -> str:
    """What the store keeps of a handle that leaves the server (state, flow id, return code)."""
    return hashlib.sha256(f"identity-{purpose}\x00{handle}".encode()).hexdigest()


def binding_hash(browser_binding: str) -> str:
    """The stored form of the browser-binding cookie (the same hash the OAuth flows store)."""
    return hashlib.sha256(b"browser-binding\x00" + browser_binding.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class BrowserFacts:
    """What the web layer knows about the request. None of it is identity by itself.

    `headers` maps lower-cased names to every value sent under that name; `peer_trusted` says whether the
    TCP peer is in `server.trusted_proxies`.
    """

    headers: Mapping[str, tuple[str, ...]]
    peer: str | None
    peer_trusted: bool


@dataclass(frozen=True, slots=True)
class VerificationAttempt:
    """The browser pressed Continue on an open elicitation."""

    elicitation: ElicitationRecord
    browser_binding: str
    browser: BrowserFacts


@dataclass(frozen=True, slots=True)
class Verified:
    """The verifier established the browser's identity at once."""

    identity: Identity


@dataclass(frozen=True, slots=True)
class RedirectFirst:
    """Send the browser to `url` first; the verifier finishes when the browser comes back."""

    url: str = field(repr=False)  # carries a state or flow id
    verification_id: str


@dataclass(frozen=True, slots=True)
class Returned:
    """A redirecting verifier finished: who the browser is, for which elicitation."""

    elicitation_id: str
    identity: Identity
    verification_id: str
    # confirm: the operator named someone else, and that mismatch was already recorded when it said so.
    mismatch_recorded: bool = False


class VerificationRefused(Exception):
    """The verifier refuses this browser: a page status, a stable code, a title, one sentence, an audit event.

    Neither the message nor the audit detail ever holds a secret or says whom the elicitation belongs to.
    """

    def __init__(
        self,
        status_code: int,
        code: str,
        title: str,
        message: str,
        *,
        event: str,
        elicitation_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.title = title
        self.message = message
        self.event = event
        self.elicitation_id = elicitation_id
        self.detail = dict(detail or {})


class IdentityVerifier(ABC):
    """One configured way to learn who is in the browser."""

    name: ClassVar[str]

    @abstractmethod
    async def begin(self, attempt: VerificationAttempt) -> Verified | RedirectFirst:
        """Establish the browser's identity, or say where to send the browser first. May raise VerificationRefused."""

    async def form_targets(self) -> list[str]:
        """Origins the consent form's Continue may redirect to (for the page's CSP `form-action`)."""
        return []


async def insert_verification(
    rt: Runtime,
    attempt: VerificationAttempt,
    *,
    verification_id: str,
    verifier: str,
    handle_hash: str,
    nonce: str | None = None,
    pkce_key_id: str | None = None,
    pkce_ciphertext: bytes | None = None,
) -> None:
    """Store the server-side row of a verification that sends the browser away, bound to its browser and expiry."""
    now = rt.now()
    await rt.store.verifications.insert(
        VerificationRecord(
            id=verification_id,
            elicitation_id=attempt.elicitation.id,
            verifier=verifier,
            handle_hash=handle_hash,
            return_hash=None,
            browser_binding_hash=binding_hash(attempt.browser_binding),
            nonce=nonce,
            pkce_key_id=pkce_key_id,
            pkce_ciphertext=pkce_ciphertext,
            outcome=None,
            identity=None,
            created_at=now,
            expires_at=min(attempt.elicitation.expires_at, now + VERIFICATION_TTL),
            confirmed_at=None,
            used_at=None,
        )
    )


async def claim_for_browser(
    rt: Runtime, record: VerificationRecord, browser_binding: str | None, *, verifier: str
) -> VerificationRecord:
    """Use a verification row once, from the browser that started it. Raises VerificationRefused otherwise.

    A row brought back by another browser is not consumed: the rightful browser can still finish.
    """
    if browser_binding is None or binding_hash(browser_binding) != record.browser_binding_hash:
        raise VerificationRefused(
            403,
            "browser_mismatch",
            "Different browser",
            "This sign-in must be finished in the browser where the link was opened.",
            event="browser_mismatch",
            elicitation_id=record.elicitation_id,
            detail={"identity_verifier": verifier, "step": "identity"},
        )
    claimed = await rt.store.verifications.claim(record.id, rt.now())
    if claimed is not None:
        return claimed
    record = await rt.store.verifications.get_by_handle(record.handle_hash) or record  # what beat us to it
    if record.used_at is not None or (record.verifier == "confirm" and record.confirmed_at is None):
        raise VerificationRefused(
            400,
            "verification_used",
            "Link already used",
            "This sign-in answer was already used. Open the link from the agent again.",
            event="replay_attempt" if record.used_at is not None else "verification_unconfirmed",
            elicitation_id=record.elicitation_id,
            detail={"identity_verifier": verifier, "step": "identity"},
        )
    raise VerificationRefused(
        400,
        "verification_expired",
        "Sign-in expired",
        "This sign-in took too long. Open the link from the agent again.",
        event="verification_expired",
        elicitation_id=record.elicitation_id,
        detail={"identity_verifier": verifier},
    )
