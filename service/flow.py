"""The browser side of an elicitation: open, verify, send to the provider, take the callback.

Each step checks the elicitation's state through the store's atomic transitions, records an audit
event, and raises `FlowError` (a status code, a stable code and a sentence for the page) when the
browser must be refused. The web layer renders; this module decides.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .errors import ConnectorError, ProviderError
from .events import ElicitationEvent
from .identity import Identity
from .lifecycle import audit_elicitation, finish
from .oauth import (
    IdTokenError,
    TokenSet,
    authorization_url,
    exchange_code,
    fetch_account,
    new_flow_secrets,
    validate_id_token,
)
from .providers import ProviderEntry, issuer_matches
from .runtime import Runtime
from .states import ElicitationStatus
from .store import ElicitationRecord, FlowRecord, GrantRecord
from .vault import flow_aad, grant_aad

log = logging.getLogger("service.flow")

# How long the browser may spend at the provider before the state is no longer accepted.
FLOW_TTL = timedelta(minutes=10)
_ERROR_CODE = re.compile(r"[a-z0-9_.-]{1,64}")


class FlowError(Exception):
    """A refusal to show the browser: HTTP status, stable code, title and one human sentence."""

    def __init__(self, status_code: int, code: str, title: str, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.title = title
        self.message = message


@dataclass(frozen=True, slots=True)
class ConsentView:
    """What the consent page shows."""

    elicitation: ElicitationRecord
    provider: ProviderEntry
    agent_name: str


_CLOSED_PAGES: dict[ElicitationStatus, tuple[int, str, str, str]] = {
    ElicitationStatus.COMPLETED: (
        409,
        "already_completed",
        "Already connected",
        "This authorization link was already used and the connection is complete. You can close this tab.",
    ),
    ElicitationStatus.DECLINED: (
        410,
        "declined",
        "Request declined",
        "This authorization request was declined. Ask the agent again if you change your mind.",
    ),
    ElicitationStatus.CANCELLED: (
        410,
        "cancelled",
        "Request cancelled",
        "This authorization request was cancelled and can no longer be used.",
    ),
    ElicitationStatus.EXPIRED: (
        410,
        "expired",
        "Link expired",
        "This authorization link has expired. Ask the agent to start again.",
    ),
    ElicitationStatus.FAILED: (
        410,
        "failed",
        "Request failed",
        "This authorization request failed and can no longer be used. Ask the agent to start again.",
    ),
}


# Says that the link belongs to another account, and nothing about which.
IDENTITY_MISMATCH_PAGE = (
    403,
    "identity_mismatch",
    "Different account",
    "This link was started by a different account. Sign in as the user who asked the agent, "
    "or ask the agent to start again as yourself.",
)


def binding_hash(browser_binding: str) -> str:
    return hashlib.sha256(b"browser-binding\x00" + browser_binding.encode()).hexdigest()


def state_hash(state: str) -> str:
    return hashlib.sha256(b"oauth-state\x00" + state.encode()).hexdigest()


class BrowserFlow:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- shared checks ---------------------------------------------------------------------------------
    async def open_elicitation(self, elicitation_id: str, *, allow_cancelled: bool = False) -> ElicitationRecord:
        """The elicitation if the browser may still act on it; expires it lazily when its time is up.

        `allow_cancelled`: the callback may finish a flow the agent cancelled meanwhile (the grant is stored,
        nothing resumes); every other step refuses a cancelled elicitation.
        """
        store = self.rt.store
        record = await store.elicitations.get(elicitation_id)
        if record is None:
            raise FlowError(404, "unknown_elicitation", "Link not found", "This authorization link is not known here.")
        if not record.status.terminal and record.expires_at <= self.rt.now():
            await finish(self.rt, record, ElicitationStatus.EXPIRED, "expired", reason="expired before completion")
            record = await store.elicitations.get(elicitation_id) or record
        if record.status.terminal and not (allow_cancelled and record.status is ElicitationStatus.CANCELLED):
            raise FlowError(*_CLOSED_PAGES[record.status])
        return record

    # -- steps -----------------------------------------------------------------------------------------
    async def consent_view(self, elicitation_id: str) -> ConsentView:
        record = await self.open_elicitation(elicitation_id)
        await audit_elicitation(self.rt, record, "opened")
        return ConsentView(record, self.rt.catalog.get(record.provider), self.rt.settings.agent_name)

    async def decline(self, elicitation_id: str) -> None:
        record = await self.open_elicitation(elicitation_id)
        await finish(self.rt, record, ElicitationStatus.DECLINED, "declined", reason="declined on the consent page")

    async def start_authorization(self, elicitation_id: str, browser_user: Identity, browser_binding: str) -> str:
        """Check the browser's verified user against the bound one, then build the provider redirect."""
        record = await self.open_elicitation(elicitation_id)
        store, now = self.rt.store, self.rt.now()
        await self.check_identity(record, browser_user)
        try:
            entry = await self.rt.catalog.resolve(record.provider, self.rt.http)
        except ConnectorError as exc:
            raise FlowError(503, exc.code, "Provider unavailable", str(exc)) from None
        secrets_ = new_flow_secrets(entry)
        flow_id = secrets.token_urlsafe(16)
        verifier_key_id: str | None = None
        verifier_blob: bytes | None = None
        if secrets_.code_verifier is not None:
            verifier_key_id, verifier_blob = self.rt.vault.encrypt(
                secrets_.code_verifier.encode(), aad=flow_aad(flow_id)
            )
        redirect_uri = self.rt.callback_url(entry.name)
        flow = FlowRecord(
            id=flow_id,
            elicitation_id=record.id,
            state_hash=state_hash(secrets_.state),
            verifier_key_id=verifier_key_id,
            verifier_ciphertext=verifier_blob,
            nonce=secrets_.nonce,
            expected_issuer=entry.issuer,
            browser_binding_hash=binding_hash(browser_binding),
            redirect_uri=redirect_uri,
            created_at=now,
            expires_at=min(record.expires_at, now + FLOW_TTL),
            used_at=None,
        )
        async with store.transaction() as conn:
            verified = await store.elicitations.transition(record.id, ElicitationStatus.VERIFIED, now=now, conn=conn)
            if verified is None:
                raise FlowError(*_CLOSED_PAGES.get(record.status, _CLOSED_PAGES[ElicitationStatus.FAILED]))
            # A restarted flow (back button, second click) supersedes the earlier one.
            await store.flows.invalidate_open(record.id, now, conn=conn)
            await store.flows.insert(flow, conn=conn)
            await store.elicitations.transition(record.id, ElicitationStatus.AUTHORIZING, now=now, conn=conn)
            await audit_elicitation(self.rt, record, "verified", now=now, conn=conn)
        return authorization_url(entry, redirect_uri=redirect_uri, scopes=record.scopes, flow=secrets_)

    async def check_identity(self, record: ElicitationRecord, browser_user: Identity) -> None:
        """The browser's verified user must be the bound user. A mismatch is counted and audited (the page
        says nothing about whom), the elicitation stays open for the rightful user, and the mismatch that
        reaches `identity.max_mismatches` fails it as locked. Raises FlowError 403 on any mismatch."""
        if browser_user == record.identity:
            return
        store, now = self.rt.store, self.rt.now()
        limit = self.rt.settings.identity.max_mismatches
        async with store.transaction() as conn:
            count = await store.elicitations.add_identity_mismatch(record.id, now=now, conn=conn)
            await audit_elicitation(
                self.rt,
                record,
                "identity_mismatch",
                detail={
                    "identity_verifier": self.rt.settings.identity.verifier,
                    "browser_issuer": browser_user.issuer,
                    "browser_subject": browser_user.subject,
                    "mismatches": count,
                    "max_mismatches": limit,
                },
                now=now,
                conn=conn,
            )
        if count >= limit:
            await finish(
                self.rt,
                record,
                ElicitationStatus.FAILED,
                "identity_locked",
                reason=f"locked after {count} identity mismatches",
                detail={"mismatches": count},
            )
        raise FlowError(*IDENTITY_MISMATCH_PAGE)

    async def callback(
        self, provider_name: str, params: Mapping[str, str], browser_binding: str | None
    ) -> ElicitationRecord:
        """Check and finish the provider's redirect; on success the grant is stored and the elicitation completed."""
        store = self.rt.store
        state = params.get("state")
        if not state:
            raise FlowError(400, "missing_state", "Invalid request", "The provider's answer carries no state.")
        flow = await store.flows.get_by_state_hash(state_hash(state))
        if flow is None:
            await store.audit.record("unknown_state", provider=provider_name, now=self.rt.now())
            raise FlowError(
                400,
                "unknown_state",
                "Invalid request",
                "This authorization answer does not match any request.",
            )
        if flow.used_at is not None:
            await self._refuse_used_state(flow)  # raises, unless the elicitation's own closed page should answer
        record = await self.open_elicitation(flow.elicitation_id, allow_cancelled=True)
        if record.provider != provider_name:
            # One redirect URI per provider: an answer for provider A arriving at B's callback is a mix-up.
            await audit_elicitation(
                self.rt, record, "provider_mismatch", detail={"callback_provider": provider_name[:64]}
            )
            raise FlowError(
                400, "provider_mismatch", "Invalid request", "This answer came back from the wrong provider."
            )
        if browser_binding is None or binding_hash(browser_binding) != flow.browser_binding_hash:
            await audit_elicitation(self.rt, record, "browser_mismatch")
            raise FlowError(
                403,
                "browser_mismatch",
                "Different browser",
                "This authorization must be finished in the browser where it was started.",
            )
        claimed = await store.flows.claim(flow.state_hash, self.rt.now())
        if claimed is None:
            await self._state_not_claimable(flow, record)  # raises
        assert claimed is not None
        try:
            entry = await self.rt.catalog.resolve(provider_name, self.rt.http)
        except ConnectorError as exc:
            raise FlowError(503, exc.code, "Provider unavailable", str(exc)) from None
        await self._check_issuer(entry, claimed, params, record)  # raises
        if "error" in params:
            await self._provider_refused(record, params)
        code = params.get("code")
        if not code:
            await finish(self.rt, record, ElicitationStatus.FAILED, "provider_error", reason="no authorization code")
            raise FlowError(400, "missing_code", "Invalid request", "The provider's answer carries no code.")
        verifier = None
        if claimed.verifier_ciphertext is not None and claimed.verifier_key_id is not None:
            verifier = self.rt.vault.decrypt(
                claimed.verifier_key_id, claimed.verifier_ciphertext, aad=flow_aad(claimed.id)
            ).decode()
        try:
            tokens = await exchange_code(entry, redirect_uri=claimed.redirect_uri, code=code, code_verifier=verifier)
            id_claims = None
            if entry.oidc:
                # Checked before anything is stored: the account is the ID token's `sub`, signed by the issuer
                # this very request expected, for our client, with the nonce this browser's request carried.
                id_claims = await validate_id_token(
                    entry,
                    tokens.id_token,
                    expected_issuer=claimed.expected_issuer,
                    nonce=claimed.nonce,
                    jwks=self.rt.jwks,
                    http=self.rt.http,
                    now=self.rt.now().timestamp(),
                )
            account_id, _profile = await fetch_account(entry, tokens, id_claims)
        except ProviderError as exc:
            check = exc.check if isinstance(exc, IdTokenError) else None
            await finish(
                self.rt,
                record,
                ElicitationStatus.FAILED,
                "provider_error",
                reason=exc.code if check is None else f"{exc.code}: {check}",
                detail={"error": exc.code, **({"check": check} if check is not None else {})},
            )
            raise FlowError(502, exc.code, "Provider error", str(exc)) from None
        return await self._complete(record, entry, tokens, account_id)

    # -- helpers ---------------------------------------------------------------------------------------
    async def _refuse_used_state(self, flow: FlowRecord) -> None:
        """A state that was used before comes back: a replay, unless its elicitation ended some other way."""
        record = await self.rt.store.elicitations.get(flow.elicitation_id)
        if record is None:
            raise FlowError(404, "unknown_elicitation", "Link not found", "This authorization link is not known here.")
        if record.status.terminal and record.status is not ElicitationStatus.COMPLETED:
            return  # declined, expired, ...: `open_elicitation` shows that page
        await self._state_not_claimable(flow, record)

    async def _state_not_claimable(self, flow: FlowRecord, record: ElicitationRecord) -> None:
        """The state was used before (a replay) or its time ran out: say which, record it, refuse."""
        now = self.rt.now()
        current = await self.rt.store.flows.get_by_state_hash(flow.state_hash)
        # Unused yet unclaimable means expired; used means answered before (or superseded by a newer start).
        replay = current is None or current.used_at is not None
        await audit_elicitation(self.rt, record, "replay_attempt" if replay else "state_expired", now=now)
        if replay:
            raise FlowError(
                400,
                "state_used",
                "Link already used",
                "This authorization answer was already used. If you just connected, you are done and can close "
                "this tab; otherwise start again from the agent's link.",
            )
        raise FlowError(
            400,
            "state_expired",
            "Took too long",
            "The sign-in at the provider took too long. Open the agent's link again to start over.",
        )

    async def _check_issuer(
        self, entry: ProviderEntry, flow: FlowRecord, params: Mapping[str, str], record: ElicitationRecord
    ) -> None:
        """RFC 9207: when the provider sends `iss` (or promises to), it must be the issuer we expected.

        Checked before the code is used, so a code from a mixed-up provider never reaches a token endpoint.
        The flow is spent; the elicitation stays open, so its user can start again from the connect page.
        """
        expected = flow.expected_issuer
        if expected is None:
            return
        received = params.get("iss")
        if received is None and not entry.authorization_response_iss_parameter_supported:
            return
        if received is None or not issuer_matches(expected, received):
            log.warning("issuer mismatch on callback", extra={"elicitation_id": record.id})
            await audit_elicitation(
                self.rt, record, "issuer_mismatch", detail={"iss": "missing" if received is None else "unexpected"}
            )
            raise FlowError(
                400,
                "issuer_mismatch",
                "Invalid response",
                "The answer did not come from the expected provider.",
            )

    async def _provider_refused(self, record: ElicitationRecord, params: Mapping[str, str]) -> None:
        # RFC 6749 error codes are short ASCII words; anything else is shown and stored as a placeholder.
        raw = params.get("error", "")
        error = raw if _ERROR_CODE.fullmatch(raw) else "unrecognised_error"
        declined = error == "access_denied"
        await finish(
            self.rt,
            record,
            ElicitationStatus.DECLINED if declined else ElicitationStatus.FAILED,
            "provider_error",
            reason=f"provider error: {error}"[:200],
            detail={"error": error[:100]},
        )
        if declined:
            raise FlowError(
                400,
                "access_denied",
                "Access not granted",
                "You did not grant access at the provider. Nothing was stored.",
            )
        raise FlowError(400, "provider_error", "Provider error", f"The provider reported an error: {error[:100]}.")

    async def _complete(
        self, record: ElicitationRecord, entry: ProviderEntry, tokens: TokenSet, account_id: str
    ) -> ElicitationRecord:
        store, now = self.rt.store, self.rt.now()
        aad = grant_aad(record.identity.issuer, record.identity.subject, entry.name, account_id)
        key_id, blob = self.rt.vault.encrypt_json(tokens.to_json(), aad=aad)
        grant = GrantRecord(
            id=secrets.token_urlsafe(16),
            identity=record.identity,
            provider=entry.name,
            provider_account_id=account_id,
            scopes=tokens.scopes if tokens.scopes is not None else record.scopes,
            token_key_id=key_id,
            token_ciphertext=blob,
            token_expires_at=_expiry(tokens),
            created_at=now,
            updated_at=now,
        )
        async with store.transaction() as conn:
            completed = await store.elicitations.transition(record.id, ElicitationStatus.COMPLETED, now=now, conn=conn)
            # The agent may have cancelled while the user was at the provider. The user did authorize,
            # so the grant is kept, but the cancelled elicitation stays cancelled and resumes nothing.
            late = completed is None
            stored = await store.grants.upsert(grant, conn=conn)
            await audit_elicitation(
                self.rt,
                record,
                "completed_after_cancel" if late else "completed",
                detail={"grant_id": stored.id, "scopes": list(stored.scopes)},
                now=now,
                conn=conn,
            )
        if completed is None:
            return await store.elicitations.get(record.id) or record
        self.rt.bus.publish(ElicitationEvent(record.id, ElicitationStatus.COMPLETED, record.connection_key))
        return completed


def _expiry(tokens: TokenSet) -> datetime | None:
    return datetime.fromtimestamp(tokens.expires_at, UTC) if tokens.expires_at is not None else None
