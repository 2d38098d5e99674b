"""The identity step of the browser flow: who is in the browser, before anything goes to the provider.

A verifier (see `service.identity`) either knows the browser's identity at once (`Verified`) or sends the browser
away first (`RedirectFirst`) and finishes on a route of its own (`Returned`). Either way the identity is compared
with the bound one by `BrowserFlow.check_identity`, and only then does the browser go on to the provider. A
verifier never decides that comparison itself.

Both buttons of the consent page pass this step: Continue goes on to the provider, Decline ends the elicitation,
each only once the browser is known to be the bound user. A browser that is not gets "this link is not for you"
for a Decline, which is audited and changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from .browser import BrowserFlow
from .errors import FlowRefused
from .identity import Identity
from .records import ElicitationRecord, Intent


@dataclass(frozen=True, slots=True)
class BrowserFacts:
    """What the web layer knows about the request. None of it is identity by itself.

    `headers` maps lower-cased names to every value sent under that name; `peer_trusted` says whether the
    TCP peer is one of the trusted proxies.
    """

    headers: Mapping[str, tuple[str, ...]]
    peer: str | None
    peer_trusted: bool


@dataclass(frozen=True, slots=True)
class VerificationAttempt:
    """The browser pressed Continue or Decline (`intent`) on an open elicitation.

    A verifier that sends the browser away keeps `intent` with its state (`insert_verification` does) and hands it
    back in `Returned`.
    """

    elicitation: ElicitationRecord
    browser_binding: str
    browser: BrowserFacts
    intent: Intent = Intent.CONTINUE


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
    # The mismatch was already recorded (confirm: when the operator named someone else).
    mismatch_recorded: bool = False
    intent: Intent = Intent.CONTINUE  # the attempt's, from the verifier's stored state


class Verifier(Protocol):
    """One way to learn who is in the browser (the configured `identity.verifier`)."""

    @property
    def name(self) -> str: ...

    async def begin(self, attempt: VerificationAttempt) -> Verified | RedirectFirst:
        """Establish the browser's identity, or say where to send it first. May raise FlowRefused."""
        ...

    async def form_targets(self) -> list[str]:
        """Origins the consent form's Continue may redirect to (for the page's CSP `form-action`)."""
        ...


class IdentityStep:
    def __init__(self, flow: BrowserFlow, verifier: Verifier) -> None:
        self.flow = flow
        self.verifier = verifier
        self.elicitations = flow.elicitations

    async def begin(self, elicitation_id: str, browser_binding: str, browser: BrowserFacts) -> str:
        """Continue was pressed: the URL to send the browser to (the provider, or the verifier first)."""
        step = await self._verify(elicitation_id, browser_binding, browser, Intent.CONTINUE)
        if isinstance(step, str):
            return step
        return await self.flow.start_authorization(*step, browser_binding)

    async def decline(self, elicitation_id: str, browser_binding: str, browser: BrowserFacts) -> str | None:
        """Decline was pressed: None once declined, or the URL of the verifier's sign-in to send the browser to
        first. FlowRefused `not_your_link` when the browser is not the bound user (nothing changes then)."""
        step = await self._verify(elicitation_id, browser_binding, browser, Intent.DECLINE)
        if isinstance(step, str):
            return step
        await self.flow.decline(*step)
        return None

    async def continue_after(self, returned: Returned, browser_binding: str) -> str:
        """A redirecting verifier finished: the URL to send the browser to. For a Continue, the provider; for a
        Decline, the connect page, which now says the request was declined."""
        if returned.intent is Intent.DECLINE:
            if returned.mismatch_recorded:
                raise FlowRefused("not_your_link")
            await self.flow.decline(await self.flow.open_elicitation(returned.elicitation_id), returned.identity)
            return self.flow.settings.connect_url(returned.elicitation_id)
        if returned.mismatch_recorded:
            raise FlowRefused("identity_mismatch")
        record = await self.flow.open_elicitation(returned.elicitation_id)
        return await self.flow.start_authorization(record, returned.identity, browser_binding)

    async def _verify(
        self, elicitation_id: str, browser_binding: str, browser: BrowserFacts, intent: Intent
    ) -> tuple[ElicitationRecord, Identity] | str:
        """The elicitation (as read) and the browser's identity when the verifier knows it at once, else the URL
        the verifier sends the browser to."""
        if intent is Intent.CONTINUE:  # as the consent page just read it, when it did here
            record = await self.flow.shown_elicitation(elicitation_id)
        else:
            record = await self.flow.open_elicitation(elicitation_id)
        async with self.refusals():
            step = await self.verifier.begin(VerificationAttempt(record, browser_binding, browser, intent))
        if isinstance(step, Verified):
            return record, step.identity
        await self.elicitations.audit(
            record,
            "identity_challenge",
            detail={
                "identity_verifier": self.verifier.name,
                "verification_id": step.verification_id,
                "intent": intent.value,
            },
        )
        return step.url

    async def check_identity(
        self, elicitation_id: str, identity: Identity, intent: Intent = Intent.CONTINUE
    ) -> ElicitationRecord:
        """Compare an identity a verifier learned out of band with the bound one (FlowRefused on mismatch)."""
        record = await self.flow.open_elicitation(elicitation_id)
        await self.flow.check_identity(record, identity, intent)
        return record

    @asynccontextmanager
    async def refusals(self) -> AsyncIterator[None]:
        """Around a verifier's own work: a FlowRefused naming an audit event is recorded, then passed on."""
        try:
            yield
        except FlowRefused as exc:
            await self.elicitations.record_refusal(exc)
            raise
