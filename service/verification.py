"""The identity step of the browser flow: run the configured verifier, then hand over to the provider.

Continue on the consent page calls `begin`: a verifier that knows the browser's identity at once goes straight
to `BrowserFlow.start_authorization` (which compares it with the bound identity); one that must send the
browser away first returns that URL, and the browser's return (`finish_oidc`, `finish_confirm`) continues the
same way. The operator's confirmation (`confirm`) is compared here too. Every refusal is audited and
becomes a `FlowError`; the comparison and the mismatch count live in `BrowserFlow.check_identity` alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .flow import IDENTITY_MISMATCH_PAGE, BrowserFlow, FlowError
from .identity.base import (
    BrowserFacts,
    IdentityVerifier,
    RedirectFirst,
    Returned,
    VerificationAttempt,
    VerificationRefused,
    Verified,
)
from .identity.confirm import ConfirmVerifier
from .identity.oidc import OidcVerifier
from .lifecycle import audit_elicitation
from .runtime import Runtime


@dataclass(frozen=True, slots=True)
class ConfirmAnswer:
    """What the operator's app hears back: where to send the browser, and whether the identity matched."""

    matched: bool
    next_uri: str
    error: FlowError | None = None


class IdentityStep:
    def __init__(self, runtime: Runtime, verifier: IdentityVerifier, flow: BrowserFlow) -> None:
        self.rt = runtime
        self.verifier = verifier
        self.flow = flow

    async def form_targets(self) -> list[str]:
        return await self.verifier.form_targets()

    async def begin(self, elicitation_id: str, browser_binding: str, browser: BrowserFacts) -> str:
        """Continue was pressed: the URL to send the browser to (the provider, or the verifier first)."""
        record = await self.flow.open_elicitation(elicitation_id)
        try:
            step = await self.verifier.begin(VerificationAttempt(record, browser_binding, browser))
        except VerificationRefused as exc:
            raise await self._refused(exc) from None
        if isinstance(step, Verified):
            return await self.flow.start_authorization(record.id, step.identity, browser_binding)
        assert isinstance(step, RedirectFirst)
        await audit_elicitation(
            self.rt,
            record,
            "identity_challenge",
            detail={"identity_verifier": self.verifier.name, "verification_id": step.verification_id},
        )
        return step.url

    async def finish_oidc(self, params: Mapping[str, str], browser_binding: str | None) -> str:
        """The identity provider sent the browser back: the provider URL to continue to."""
        assert isinstance(self.verifier, OidcVerifier)
        try:
            returned = await self.verifier.complete(dict(params), browser_binding)
        except VerificationRefused as exc:
            raise await self._refused(exc) from None
        return await self._continue(returned, browser_binding)

    async def finish_confirm(self, code: str | None, browser_binding: str | None) -> str:
        """The browser came back from the operator's app: the provider URL to continue to."""
        assert isinstance(self.verifier, ConfirmVerifier)
        try:
            returned = await self.verifier.complete(code, browser_binding)
        except VerificationRefused as exc:
            raise await self._refused(exc) from None
        return await self._continue(returned, browser_binding)

    async def confirm(self, flow_id: str, user_id: str) -> ConfirmAnswer:
        """The operator's app (already authenticated) says `user_id` is logged in for `flow_id`.

        Raises FlowError for an unknown, used or expired flow id or a closed elicitation; otherwise answers
        with the browser's next stop. A mismatch is recorded now; the browser's next stop then shows the refusal.
        """
        assert isinstance(self.verifier, ConfirmVerifier)
        try:
            identity = self.verifier.identity_of(user_id)
        except ValueError as exc:
            raise FlowError(400, "bad_request", "Invalid request", str(exc)) from None
        try:
            record = await self.verifier.lookup(flow_id)
        except VerificationRefused as exc:
            raise await self._refused(exc) from None
        elicitation = await self.flow.open_elicitation(record.elicitation_id)
        matched = identity == elicitation.identity
        try:
            code = await self.verifier.record_answer(record, identity, matched=matched)
        except VerificationRefused as exc:
            raise await self._refused(exc) from None
        next_uri = self.verifier.return_url(code)
        if matched:
            await audit_elicitation(
                self.rt,
                elicitation,
                "identity_confirmed",
                detail={"identity_verifier": self.verifier.name, "verification_id": record.id},
            )
            return ConfirmAnswer(True, next_uri)
        try:
            await self.flow.check_identity(elicitation, identity)
        except FlowError as exc:
            return ConfirmAnswer(False, next_uri, exc)
        raise AssertionError("check_identity accepted a mismatched identity")  # pragma: no cover

    async def _continue(self, returned: Returned, browser_binding: str | None) -> str:
        assert browser_binding is not None  # claim_for_browser checked it
        if returned.mismatch_recorded:
            raise FlowError(*IDENTITY_MISMATCH_PAGE)
        return await self.flow.start_authorization(returned.elicitation_id, returned.identity, browser_binding)

    async def _refused(self, exc: VerificationRefused) -> FlowError:
        identity: Any = None
        provider = None
        if exc.elicitation_id is not None:
            record = await self.rt.store.elicitations.get(exc.elicitation_id)
            if record is not None:
                identity, provider = record.identity, record.provider
        await self.rt.store.audit.record(
            exc.event,
            elicitation_id=exc.elicitation_id,
            identity=identity,
            provider=provider,
            detail=exc.detail,
            now=self.rt.now(),
        )
        return FlowError(exc.status_code, exc.code, exc.title, exc.message)
