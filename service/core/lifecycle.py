"""The life of an elicitation, from creation to its one terminal state, whoever drives it.

`Elicitations` creates elicitations, records the client's answer, cancels, expires and ends them. Each change is
one checked transition (`service.core.states`) written with its audit line in one transaction, and a terminal
change is published as an `ElicitationEvent` after the commit. The embedded API (`service.acp`) and the `/v1`
API use this one implementation.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from .errors import FlowRefused
from .events import ElicitationEvent
from .handles import new_id
from .identity import Identity
from .outcomes import (
    CLIENT_DISCONNECTED,
    NARROWED_BEFORE,
    NARROWED_NOW,
    AuthorizationOutcome,
    AuthorizationStatus,
    GrantInfo,
    StopCause,
    refusal_message,
    refusal_reason,
    terminal_status,
)
from .ports import AuditGate, EventSink, FlowMetrics, GrantRepo, ProviderGateway, Store, Tx
from .records import ElicitationRecord, GrantRecord
from .scopes import ElicitationScope, RequestScope, SessionScope
from .settings import FlowSettings
from .states import ElicitationStatus


class AnswerKind(StrEnum):
    """How the client answered `elicitation/create` (or why there is no answer)."""

    ACCEPT = "accept"  # the user consented to open the URL; the flow goes on in the browser
    DECLINE = "decline"
    CANCEL = "cancel"  # with `client_message`: the client refused by its own policy; without: a person dismissed it
    UNKNOWN_ACTION = "unknown_action"  # an `action` this connector does not know (`action` names it)
    ERROR = "error"  # a JSON-RPC error, or an answer that cannot be read
    DISCONNECTED = "disconnected"  # the connection closed before an answer came


@dataclass(frozen=True, slots=True)
class ClientAnswer:
    kind: AnswerKind
    error_code: int | None = None  # the JSON-RPC error code, for ERROR
    message: str | None = None  # a short, secret-free explanation of our own, for ERROR
    client_message: str | None = None  # the client's `_meta.message` on a cancel, as received (sanitised here)
    action: str | None = None  # the unknown action, as received (sanitised here), for UNKNOWN_ACTION


CLIENT_TEXT_LIMIT = 200  # characters kept of a text the client chose (a refusal's message, an unknown action)


def client_text(value: object, limit: int = CLIENT_TEXT_LIMIT) -> str | None:
    """A text the client chose, fit for an outcome, an audit row and a log line: control and format characters
    (including bidirectional overrides) become spaces, whitespace runs collapse, at most `limit` characters are
    kept (an ellipsis marks the cut). None when there is no text."""
    if not isinstance(value, str):
        return None
    cleaned = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in value[: limit * 4])
    text = " ".join(cleaned.split())
    if not text:
        return None
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


EXPIRED_REASON = "expired before completion"


def covers(granted: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether a grant with `granted` scopes covers every scope in `wanted`."""
    return set(wanted) <= set(granted)


class Elicitations:
    def __init__(
        self,
        store: Store,
        events: EventSink,
        providers: ProviderGateway,
        settings: FlowSettings,
        clock: Callable[[], datetime],
        metrics: FlowMetrics | None = None,
        unattributed: AuditGate | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.providers = providers
        self.settings = settings
        self.now = clock
        self.metrics = metrics
        self.unattributed = unattributed

    # -- reading ----------------------------------------------------------------------------------------
    async def get(self, elicitation_id: str) -> ElicitationRecord | None:
        return await self.store.elicitations.get(elicitation_id)

    async def find_grant(self, user: Identity, provider: str, scopes: Sequence[str]) -> GrantRecord | None:
        """The newest grant of `user` at `provider` that covers every scope asked for."""
        return await find_grant(self.store.grants, user, provider, scopes)

    async def settled(
        self, user: Identity, provider: str, scopes: Sequence[str], *, ask_again: bool = False
    ) -> AuthorizationOutcome | None:
        """The answer to a request that needs nobody asked, or None: ALREADY_AUTHORIZED when a stored grant covers
        `scopes`; NARROWED when a stored grant lacks only scopes the provider refused when it was made (so asking
        again would ask the user the same thing), unless `ask_again`."""
        grants = await self.store.grants.find(user, provider)
        display_name = self.providers.display_name(provider)
        for grant in grants:
            if covers(grant.scopes, scopes):
                return AuthorizationOutcome(
                    AuthorizationStatus.ALREADY_AUTHORIZED,
                    provider,
                    grant=GrantInfo.of(grant),
                    provider_display_name=display_name,
                )
        for grant in () if ask_again else grants:
            missing = [scope for scope in scopes if scope not in grant.scopes]
            if set(missing) <= set(grant.refused_scopes):
                return AuthorizationOutcome(
                    AuthorizationStatus.NARROWED,
                    provider,
                    grant=GrantInfo.of(grant),
                    reason=NARROWED_BEFORE,
                    provider_display_name=display_name,
                    refused_scopes=tuple(missing),
                )
        return None

    async def outcome(self, record: ElicitationRecord) -> AuthorizationOutcome:
        """The outcome of an ended elicitation (with the grant, when it completed)."""
        status = terminal_status(record)
        grant = None
        if status is AuthorizationStatus.AUTHORIZED:
            # The grant covering what was asked; else (a narrowed grant) the newest one of this user there.
            found = await self.find_grant(record.identity, record.provider, record.scopes)
            if found is None:
                found = next(iter(await self.store.grants.find(record.identity, record.provider)), None)
            grant = GrantInfo.of(found) if found is not None else None
        return self.outcome_of(
            record,
            status,
            grant=grant,
            reason=record.failure_reason,
            client_message=refusal_message(record.failure_reason) if status is AuthorizationStatus.REFUSED else None,
        )

    async def outcome_of_event(self, record: ElicitationRecord, event: ElicitationEvent) -> AuthorizationOutcome:
        """The outcome an ended elicitation's terminal event tells. An event from this process carries the grant
        or the reason; one from another process (the event log holds ids and statuses only) is completed from the
        store."""
        if event.grant is None and event.reason is None:
            return await self.outcome(await self.get(record.id) or record)
        ended = replace(record, status=event.status, failure_reason=event.reason)
        status = terminal_status(ended)
        return self.outcome_of(
            ended,
            status,
            grant=event.grant,
            reason=event.reason,
            client_message=refusal_message(event.reason) if status is AuthorizationStatus.REFUSED else None,
        )

    def outcome_of(
        self,
        record: ElicitationRecord,
        status: AuthorizationStatus,
        *,
        grant: GrantInfo | None = None,
        reason: str | None = None,
        error_code: int | None = None,
        client_message: str | None = None,
    ) -> AuthorizationOutcome:
        refused: tuple[str, ...] = ()
        if status is AuthorizationStatus.AUTHORIZED and grant is not None:
            refused = tuple(scope for scope in record.scopes if scope not in grant.scopes)
            if refused:
                status, reason = AuthorizationStatus.NARROWED, NARROWED_NOW
        return AuthorizationOutcome(
            status,
            record.provider,
            record.id,
            grant=grant,
            reason=reason,
            error_code=error_code,
            client_message=client_message,
            provider_display_name=self.providers.display_name(record.provider),
            refused_scopes=refused,
        )

    # -- changes ----------------------------------------------------------------------------------------
    def default_message(self, provider: str, scopes: Sequence[str]) -> str:
        listed = ", ".join(scopes) if scopes else "basic access"
        return f"Authorize access to your {self.providers.display_name(provider)} account ({listed})."

    async def create(
        self,
        *,
        connection_key: str,
        user: Identity,
        provider: str,
        scopes: Sequence[str],
        scope: ElicitationScope,
        message: str | None = None,
        agent_name: str | None = None,
        within: Callable[[ElicitationRecord, Tx], Awaitable[None]] | None = None,
        replica_id: str | None = None,
    ) -> ElicitationRecord:
        """A new pending elicitation; its time (`elicitation_ttl`) runs from now.

        `agent_name` is who the consent page says asks (default: the configured agent name). `within` runs in
        the creating transaction, to write what belongs with the new row; if it raises, nothing is written.
        `replica_id` names the replica whose process holds the connection `connection_key`: the one that tells
        the client when it completes (None: no process here holds it, e.g. a `/v1` agent's own connection).
        """
        now = self.now()
        record = ElicitationRecord(
            id=new_id(24),  # 192 random bits
            connection_key=connection_key,
            identity=user,
            provider=provider,
            scopes=tuple(scopes),
            scope_kind="session" if isinstance(scope, SessionScope) else "request",
            session_id=scope.session_id if isinstance(scope, SessionScope) else None,
            tool_call_id=scope.tool_call_id if isinstance(scope, SessionScope) else None,
            request_id=scope.request_id if isinstance(scope, RequestScope) else None,
            agent_name=agent_name or self.settings.agent_name,
            message=message or self.default_message(provider, scopes),
            status=ElicitationStatus.PENDING,
            failure_reason=None,
            created_at=now,
            expires_at=now + self.settings.elicitation_ttl,
            updated_at=now,
            replica_id=replica_id,
        )
        async with self.store.transaction() as tx:
            await self.store.elicitations.insert(record, conn=tx)
            if within is not None:
                await within(record, tx)
            await self.audit(
                record, "created", detail={"scopes": list(record.scopes), "scope_kind": record.scope_kind}, conn=tx
            )
        if self.metrics is not None:
            self.metrics.flow_started(provider)
        return record

    async def consented(self, record: ElicitationRecord) -> None:
        """The client answered accept. The browser may already be ahead: then nothing changes."""
        async with self.store.transaction() as tx:
            if await self.store.elicitations.transition(
                record.id, ElicitationStatus.CONSENTED, now=self.now(), conn=tx
            ):
                await self.audit(record, "consented", conn=tx)

    async def answered(self, record: ElicitationRecord, answer: ClientAnswer) -> AuthorizationOutcome | None:
        """Record an answer other than accept; the outcome, or None for accept (the browser decides then).

        A cancel that carries the client's own reason (`_meta.message`) is the client refusing by its policy
        (`refused`, event `refused`); a plain cancel is a person dismissing it (`cancelled`).
        """
        if answer.kind is AnswerKind.ACCEPT:
            await self.consented(record)
            return None
        client_message = client_text(answer.client_message) if answer.kind is AnswerKind.CANCEL else None
        event: str | None = None
        if answer.kind is AnswerKind.DECLINE:
            status, target, reason = AuthorizationStatus.DECLINED, ElicitationStatus.DECLINED, "declined in the client"
        elif answer.kind is AnswerKind.CANCEL and client_message is not None:
            status, target = AuthorizationStatus.REFUSED, ElicitationStatus.CANCELLED
            reason = refusal_reason(client_message)
        elif answer.kind is AnswerKind.CANCEL:
            status, target, reason = (
                AuthorizationStatus.CANCELLED,
                ElicitationStatus.CANCELLED,
                "dismissed in the client",
            )
        elif answer.kind is AnswerKind.DISCONNECTED:
            status, target, reason = AuthorizationStatus.DISCONNECTED, ElicitationStatus.CANCELLED, CLIENT_DISCONNECTED
            event = CLIENT_DISCONNECTED
        elif answer.kind is AnswerKind.UNKNOWN_ACTION:
            status, target = AuthorizationStatus.CLIENT_ERROR, ElicitationStatus.FAILED
            reason = f"unknown_action: {client_text(answer.action, 64) or '(empty)'}"
        else:
            status, target = AuthorizationStatus.CLIENT_ERROR, ElicitationStatus.FAILED
            reason = (
                f"client answered with JSON-RPC error {answer.error_code}"
                if answer.error_code is not None
                else answer.message or "the client's answer could not be read"
            )
        detail = {"client_message": client_message} if client_message is not None else None
        if await self.finish(record, target, event or status.value, reason=reason, detail=detail):
            return self.outcome_of(
                record, status, reason=reason, error_code=answer.error_code, client_message=client_message
            )
        # Something else ended it first (the browser can finish before the client's answer arrives).
        current = await self.get(record.id)
        return await self.outcome(current or record)

    async def finish(
        self,
        record: ElicitationRecord,
        status: ElicitationStatus,
        event: str,
        *,
        reason: str | None = None,
        detail: Mapping[str, object] | None = None,
        close_flows: bool = True,
    ) -> bool:
        """Move to a terminal status if the current one allows it; False when something else ended it first.

        `close_flows=False` leaves a flow the user already started at the provider usable, so that an
        authorization the user completes after a cancellation is still stored (it resumes nothing).
        """
        now = self.now()
        async with self.store.transaction() as tx:
            updated = await self.store.elicitations.transition(record.id, status, reason=reason, now=now, conn=tx)
            if updated is None:
                return False
            if close_flows:
                await self.store.flows.invalidate_open(record.id, now, conn=tx)
            await self.audit(record, event, detail={"reason": reason, **(detail or {})}, now=now, conn=tx)
            logged = await self.store.outbox.append(
                [ElicitationEvent(record.id, status, record.connection_key, reason=reason)], at=now, conn=tx
            )
        self.ended(record, logged[0])
        return True

    async def cancel(
        self,
        record: ElicitationRecord,
        cause: StopCause,
        *,
        request_cancelled: bool | None = None,
        via: str | None = None,
    ) -> bool:
        """End an open elicitation as cancelled for `cause` (stored as its reason, so a disconnect reads as one on
        every face); `request_cancelled`: whether the agent withdrew its outstanding `elicitation/create`. A flow the
        user already took to the provider still stores its grant; the elicitation stays cancelled. False when
        something else ended it first."""
        detail: dict[str, object] = {"cause": cause.value}
        if request_cancelled is not None:
            detail["request_cancelled"] = request_cancelled
        if via is not None:
            detail["via"] = via
        return await self.finish(
            record, ElicitationStatus.CANCELLED, cause.event, reason=cause.reason, detail=detail, close_flows=False
        )

    async def expire_due(self, *, limit: int) -> int:
        """Expire up to `limit` open elicitations whose time is up (audited, logged, waiters told); how many."""
        now = self.now()
        async with self.store.transaction() as tx:
            expired = await self.store.elicitations.expire_due(now, limit=limit, reason=EXPIRED_REASON, conn=tx)
            await self.store.audit.record_many("expired", expired, detail={"reason": EXPIRED_REASON}, now=now, conn=tx)
            logged = await self.store.outbox.append(
                [
                    ElicitationEvent(r.id, ElicitationStatus.EXPIRED, r.connection_key, reason=EXPIRED_REASON)
                    for r in expired
                ],
                at=now,
                conn=tx,
            )
        for rec, event in zip(expired, logged, strict=True):
            self.ended(rec, event)
        return len(logged)

    def ended(self, record: ElicitationRecord, event: ElicitationEvent) -> None:
        """After the commit of `record`'s terminal transition: count it and publish its event."""
        if self.metrics is not None:
            self.metrics.flow_ended(record.provider, event.status)
        self.events.publish(replace(event, replica_id=record.replica_id))

    async def expire_if_due(self, record: ElicitationRecord) -> ElicitationRecord:
        """End an open elicitation whose time is up (before the sweeper gets to it); the current record either way."""
        if record.status.terminal or record.expires_at > self.now():
            return record
        await self.finish(record, ElicitationStatus.EXPIRED, "expired", reason=EXPIRED_REASON)
        return await self.get(record.id) or record

    async def audit(
        self,
        record: ElicitationRecord,
        event: str,
        *,
        detail: Mapping[str, object] | None = None,
        now: datetime | None = None,
        conn: Tx = None,
    ) -> None:
        """Record an audit event about `record` (its id, bound identity and provider)."""
        await self.store.audit.record(
            event,
            elicitation_id=record.id,
            identity=record.identity,
            provider=record.provider,
            detail=detail,
            now=self.now() if now is None else now,
            conn=conn,
        )

    async def record_refusal(self, exc: FlowRefused) -> None:
        """Audit a refusal that names its event (the elicitation's identity and provider when it is known; an
        event about no known elicitation is unattributed)."""
        if exc.event is None:
            return
        record = await self.get(exc.elicitation_id) if exc.elicitation_id is not None else None
        if record is None:
            await self.record_unattributed(exc.event, elicitation_id=exc.elicitation_id, detail=exc.audit_detail)
            return
        await self.audit(record, exc.event, detail=exc.audit_detail)

    async def record_unattributed(
        self,
        event: str,
        *,
        elicitation_id: str | None = None,
        provider: str | None = None,
        detail: Mapping[str, object] | None = None,
    ) -> None:
        """Audit an event a request without any credential caused (a forged form, an unknown state, a wrong key):
        written while the `unattributed` gate admits it, so a flood of such requests writes a bounded number of
        rows."""
        if self.unattributed is not None and not await self.unattributed.admit(event):
            return
        await self.store.audit.record(
            event, elicitation_id=elicitation_id, provider=provider, detail=detail, now=self.now()
        )


async def find_grant(grants: GrantRepo, user: Identity, provider: str, scopes: Sequence[str]) -> GrantRecord | None:
    """The newest grant of `user` at `provider` that covers every scope in `scopes`."""
    for grant in await grants.find(user, provider):
        if covers(grant.scopes, scopes):
            return grant
    return None
