"""The life of an elicitation, from creation to its one terminal state, whoever drives it.

`Elicitations` creates elicitations, records the client's answer, cancels, expires and ends them. Each change is
one checked transition (`service.core.states`) written with its audit line in one transaction; every final change
goes through `finish` (the sweeper's batches through `expire_due`), which logs it in the event log in the same
transaction and publishes it after the commit. What belongs with a change is written in its transaction through
`within` (`create`: an API elicitation's owner row; `finish`: the grant a completion stores). The embedded API
(`service.acp`), the browser flow and the `/v1` API use this one implementation, and ask it (not its store,
providers or settings) for what they show: a provider's name, an elicitation's link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType

from .accounts import account_ask, choose
from .answers import AnswerKind, ClientAnswer, ending_of
from .coverage import default_message, find_grant, newest_covering, request_plan, settled_by
from .credentials import credential_message
from .errors import FlowRefused
from .events import ElicitationEvent, GrantChange, GrantChanged, GrantEvent
from .handles import new_id
from .identity import Identity, identity_problem
from .outcomes import (
    AuthorizationOutcome,
    AuthorizationStatus,
    GrantInfo,
    StopCause,
    ended_outcome,
    refusal_message,
    terminal_status,
)
from .ports import AuditGate, EventSink, FlowMetrics, ProviderGateway, Store, Tx
from .records import AuditEntry, ElicitationRecord, GrantRecord
from .scopes import ElicitationScope, RequestScope, SessionScope
from .settings import FlowSettings
from .states import CompletionDelivery, ElicitationStatus
from .tenants import EMBEDDED_TENANT, TenantSharing, tenant_of_key

EXPIRED_REASON = "expired before completion"
# Most providers take no per-connection values: one shared empty mapping, not a dict kept by every pending ask.
NO_CONNECTION_VALUES: Mapping[str, str] = MappingProxyType({})
CONNECTION_CLOSED = "connection_closed"  # why a completion is undeliverable: the connection is gone
RELEASE_UNTOLD_AFTER = 30.0  # seconds a telling taken with its completion waits here for a face to start it

log = logging.getLogger("service.flow")


@dataclass(slots=True)
class GrantsSeen:
    """The grants a request's check read (`settled(..., seen=...)`), for the elicitation it then creates: `create`
    plans from them instead of reading them again. Filled by `settled`; `tenants` are the tenants they were read for
    (a create for another tenant reads its own)."""

    tenants: frozenset[str] = frozenset()
    grants: Sequence[GrantRecord] | None = None


@dataclass(frozen=True, slots=True)
class Written:
    """What a final change's `within` wrote in its transaction, for the audit line and the event: more audit detail,
    the grant stored (the event carries it, and grant caches hear of it), and grant events it logged (published
    after the commit)."""

    detail: Mapping[str, object] = field(default_factory=dict)
    grant: GrantRecord | None = None
    logged: Sequence[GrantEvent] = ()


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
        sharing: TenantSharing | None = None,
    ) -> None:
        self.store = store
        self.sharing = sharing or TenantSharing()  # which tenants see each other's grants (none by default)
        self.events = events
        self.providers = providers
        self.settings = settings
        self.now = clock
        self.metrics = metrics
        self.unattributed = unattributed
        # Completions whose telling this process took with the completion, nobody here started yet: when they
        # completed, and the timer that gives the telling back.
        self._untold: dict[str, tuple[datetime, asyncio.TimerHandle]] = {}
        self._releases: set[asyncio.Task[None]] = set()

    # -- reading ----------------------------------------------------------------------------------------
    @property
    def replica_id(self) -> str:
        """This process among the replicas sharing the database (the store's origin)."""
        return self.store.origin

    def display_name(self, provider: str) -> str:
        """The name people know `provider` by."""
        return self.providers.display_name(provider)

    def connect_url(self, elicitation_id: str) -> str:
        """The link the user opens for an elicitation (sent in `elicitation/create`)."""
        return self.settings.connect_url(elicitation_id)

    async def default_scopes(self, provider: str) -> tuple[str, ...]:
        """The scopes asked when a request names none: the provider's configured defaults. Raises
        ConnectorError when the provider is unknown or cannot be resolved."""
        return (await self.providers.resolve(provider)).default_scopes

    async def get(self, elicitation_id: str) -> ElicitationRecord | None:
        return await self.store.elicitations.get(elicitation_id)

    async def find_grant(
        self,
        user: Identity,
        provider: str,
        scopes: Sequence[str],
        tenant: str = EMBEDDED_TENANT,
        *,
        account: str | None = None,
    ) -> GrantRecord | None:
        """The newest grant of `user` at `provider` that covers every scope asked for, among those `tenant` sees, of
        the account `account` names (AccountChoiceNeeded when it names none and the user holds several there)."""
        seen = self.sharing.visible(tenant)
        display_name = self.display_name(provider)
        return await find_grant(
            self.store.grants, user, provider, scopes, seen, account=account, display_name=display_name
        )

    async def held(
        self, user: Identity, provider: str, tenant: str, account: str | None, seen: GrantsSeen | None = None
    ) -> tuple[Sequence[GrantRecord], list[GrantRecord]]:
        """The user's grants at `provider` that `tenant` sees (those `seen` holds when they were read for the same
        tenants, else read now and kept in `seen`), and of those the grants (newest first) of the account a request
        for `account` means (`accounts.choose`: none when the named account is not held; AccountChoiceNeeded when it
        names none and the user holds several). ValueError for a user no grant or elicitation can be stored for
        (`identity_problem`; the /v1 API refuses such a user earlier, as invalid_input): every request asks here
        first."""
        if (problem := identity_problem(user)) is not None:
            raise ValueError(f"the user's identity cannot be stored: its {problem}")
        tenants = self.sharing.visible(tenant)
        grants = seen.grants if seen is not None and seen.grants is not None and seen.tenants == tenants else None
        if grants is None:
            grants = await self.store.grants.find(user, provider, tenants=tenants)
            if seen is not None:
                seen.tenants, seen.grants = tenants, grants
        return grants, choose(grants, account, self.display_name(provider))

    async def settled(
        self,
        user: Identity,
        provider: str,
        scopes: Sequence[str],
        *,
        ask_again: bool = False,
        connection: Mapping[str, str] | None = None,
        tenant: str = EMBEDDED_TENANT,
        account: str | None = None,
        seen: GrantsSeen | None = None,
    ) -> AuthorizationOutcome | None:
        """The answer to a request that needs nobody asked (`coverage.settled_by`), or None. The per-connection
        values the provider needs from the agent (`connection`) are checked first: FlowRefused names a missing or
        malformed one. `seen` keeps the grants read, for the `create` that follows."""
        self.providers.connection_values(provider, connection)
        _, grants = await self.held(user, provider, tenant, account, seen)
        if ask_again and self.providers.credential_form(provider) is not None:
            return None  # a credential entry asked again: the user replaces the stored key on the form
        return settled_by(grants, provider, self.display_name(provider), scopes, ask_again=ask_again)

    async def outcome(self, record: ElicitationRecord) -> AuthorizationOutcome:
        """The outcome of an ended elicitation (with the grant, when it completed)."""
        status = terminal_status(record)
        grant = None
        if status is AuthorizationStatus.AUTHORIZED:
            # The grant covering what was asked; else (a narrowed grant) the newest one of this user there.
            tenant = tenant_of_key(record.connection_key)
            # (Several accounts: the one just stored is the newest.)
            seen = self.sharing.visible(tenant)
            grants = await self.store.grants.find(record.identity, record.provider, tenants=seen)
            found = newest_covering(grants, record.scopes) or next(iter(grants), None)
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
        """The outcome of `record`, ended in `status` (AUTHORIZED becomes NARROWED when the grant lacks a scope)."""
        display_name = self.display_name(record.provider)
        return ended_outcome(record, status, display_name, grant, reason, error_code, client_message)

    # -- changes ----------------------------------------------------------------------------------------
    def default_message(self, provider: str, scopes: Sequence[str]) -> str:
        return default_message(self.display_name(provider), scopes)

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
        connection: Mapping[str, str] | None = None,
        account: str | None = None,
        seen: GrantsSeen | None = None,
    ) -> ElicitationRecord:
        """A new pending elicitation; its time (`elicitation_ttl`) runs from now. With a grant already at the
        provider, it asks for the union of its scopes and `scopes`, and its message says why (`request_plan`).

        `agent_name` is who the consent page says asks (default: the configured agent name). `within` runs in
        the creating transaction, to write what belongs with the new row; if it raises, nothing is written.
        `replica_id` names the replica whose process holds the connection `connection_key`: the one that tells
        the client when it completes (None: no process here holds it, e.g. a `/v1` agent's own connection).
        `seen`: the grants the request's `settled` check just read (not read again when they are this tenant's).
        `account` names the account meant (`service.core.accounts`): one the user does not hold yet is a new one, for
        which the provider is asked to let the user pick (`prompt=select_account`).
        """
        values = self.providers.connection_values(provider, connection)
        form = self.providers.credential_form(provider)
        message = message or (credential_message(form) if form is not None else None)
        grants, held = await self.held(user, provider, tenant_of_key(connection_key), account, seen)
        plan = request_plan(held, self.display_name(provider), scopes, message)
        now = self.now()
        record = ElicitationRecord(
            id=new_id(24),  # 192 random bits
            connection_key=connection_key,
            identity=user,
            provider=provider,
            scopes=plan.scopes,
            scope_kind="session" if isinstance(scope, SessionScope) else "request",
            session_id=scope.session_id if isinstance(scope, SessionScope) else None,
            tool_call_id=scope.tool_call_id if isinstance(scope, SessionScope) else None,
            request_id=scope.request_id if isinstance(scope, RequestScope) else None,
            agent_name=agent_name or self.settings.agent_name,
            message=plan.message,
            status=ElicitationStatus.PENDING,
            failure_reason=None,
            created_at=now,
            expires_at=now + self.settings.elicitation_ttl,
            updated_at=now,
            replica_id=replica_id,
            connection_values=values or NO_CONNECTION_VALUES,
            account=account_ask(grants, held, account),
        )
        created = self.entry(record, "created", {"scopes": list(record.scopes), "scope_kind": record.scope_kind}, now)
        async with self.store.transaction() as tx:
            await self.store.elicitations.insert(record, conn=tx, audit=created)
            if within is not None:
                await within(record, tx)
        if self.metrics is not None:
            self.metrics.flow_started(provider)
        return record

    async def consented(self, record: ElicitationRecord) -> None:
        """The client answered accept. The browser may already be ahead: then nothing changes."""
        now = self.now()
        consented = self.entry(record, "consented", None, now)
        async with self.store.transaction() as tx:
            await self.store.elicitations.transition(
                record.id, ElicitationStatus.CONSENTED, now=now, conn=tx, audit=consented, last=True
            )

    async def answered(self, record: ElicitationRecord, answer: ClientAnswer) -> AuthorizationOutcome | None:
        """Record an answer other than accept; the outcome, or None for accept (the browser decides then)."""
        if answer.kind is AnswerKind.ACCEPT:
            await self.consented(record)
            return None
        end = ending_of(answer)
        detail = {"client_message": end.client_message} if end.client_message is not None else None
        if await self.finish(record, end.target, end.event, reason=end.reason, detail=detail):
            return self.outcome_of(
                record, end.status, reason=end.reason, error_code=answer.error_code, client_message=end.client_message
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
        within: Callable[[Tx], Awaitable[Written]] | None = None,
        late_event: str | None = None,
        first_grant: tuple[GrantRecord, Written] | None = None,
    ) -> ElicitationRecord | None:
        """Move to a terminal status if the current one allows it: the transition, its audit line and its entry in
        the event log in one transaction, then the event published. The ended record; None when something else
        ended it first. Every final change of one elicitation comes here (the sweeper's batches: `expire_due`).

        `close_flows=False` leaves a flow the user already started at the provider usable, so that an
        authorization the user completes after a cancellation is still stored (it resumes nothing).
        `within` runs in the same transaction, before the transition, whether or not that happens (what it writes
        stands: a grant the user gave is kept though the agent cancelled meanwhile); its `Written` adds to the audit
        line and the event. When the transition did not happen, `late_event` (if any) is audited instead of `event`.
        `first_grant`: a grant for a user who held none at the provider a moment ago, and what `within` would say of
        it: inserted with the ending (`end_with_first_grant`), `within` running only when its account has one by now.
        """
        now = self.now()
        # A completion this replica tells (it holds the connection): the telling is taken in the completing UPDATE,
        # not by a claim of its own after the commit (`claim_telling` hands it to the first to ask here).
        take = status is ElicitationStatus.COMPLETED and reason is None and record.replica_id == self.replica_id
        async with self.store.transaction() as tx:
            ended: tuple[ElicitationRecord, ElicitationEvent] | None = None
            written, inserted = Written(), False
            if first_grant is not None:  # in the ending's statement where the database can
                grant, written = first_grant
                audit, ending = self._ending(record, status, event, reason, detail, written, now)
                inserted, ended = await self.store.elicitations.end_with_first_grant(
                    record.id, status, ending, grant, now=now, conn=tx, audit=audit, take_telling=take, last=True
                )
            if not inserted:  # `within` first: the audit line says what it wrote, and goes with the transition
                written = await within(tx) if within is not None else Written()
                audit, ending = self._ending(record, status, event, reason, detail, written, now)
                if close_flows:
                    changed = await self.store.elicitations.transition(
                        record.id, status, reason=reason, now=now, conn=tx, audit=audit, take_telling=take
                    )
                    if changed is not None:
                        await self.store.flows.invalidate_open(record.id, now, conn=tx)
                        ended = changed, (await self.store.outbox.append([ending], at=now, conn=tx))[0]
                else:  # the ending logged in the transition's statement where the database can: the last one
                    ended = await self.store.elicitations.end(
                        record.id,
                        status,
                        ending,
                        reason=reason,
                        now=now,
                        conn=tx,
                        audit=audit,
                        take_telling=take,
                        last=True,
                    )
            if ended is None and late_event is not None:
                told = self._told(reason, detail, written)
                await self.audit(record, late_event, detail=told, now=now, conn=tx)
        updated = None if ended is None else ended[0]
        if (stored := written.grant) is not None:
            self.events.publish(GrantChanged(stored.id, stored.identity, stored.provider, GrantChange.STORED))
        for grant_event in written.logged:
            self.events.publish(grant_event)
        if ended is not None:
            if take:
                self._took_telling(record.id, now)
            self.ended(record, ended[1])
            if take:
                # One turn of the loop: the telling a listener just started goes out now, before the request that
                # completed it renders its answer (it took no statement: `claim_telling`).
                await asyncio.sleep(0)
        return updated

    @staticmethod
    def _told(reason: str | None, detail: Mapping[str, object] | None, written: Written) -> dict[str, object]:
        return {**({"reason": reason} if reason is not None else {}), **(detail or {}), **written.detail}

    def _ending(
        self,
        record: ElicitationRecord,
        status: ElicitationStatus,
        event: str,
        reason: str | None,
        detail: Mapping[str, object] | None,
        written: Written,
        now: datetime,
    ) -> tuple[AuditEntry, ElicitationEvent]:
        """A final change's audit line and event."""
        audit = self.entry(record, event, self._told(reason, detail, written), now)
        grant = GrantInfo.of(written.grant) if written.grant is not None else None
        return audit, ElicitationEvent(record.id, status, record.connection_key, reason=reason, grant=grant)

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
        ended = await self.finish(
            record, ElicitationStatus.CANCELLED, cause.event, reason=cause.reason, detail=detail, close_flows=False
        )
        return ended is not None

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

    async def claim_telling(self, elicitation_id: str) -> datetime | None:
        """Take the telling of a completion for this replica (one conditional update decides among whoever repeats
        it): when the elicitation completed; None when it was told already or settled by another replica. A
        completion this process made took its telling in the completing UPDATE: the first to ask gets it."""
        taken = self._untold.pop(elicitation_id, None)
        if taken is not None:
            taken[1].cancel()  # its give-back timer
            return taken[0]
        return await self.store.elicitations.claim_completion(elicitation_id, self.replica_id)

    def _took_telling(self, elicitation_id: str, completed_at: datetime) -> None:
        """The completing transaction took the telling for this replica: held here for the first `claim_telling`,
        given back if nobody asks within `RELEASE_UNTOLD_AFTER` (no face here tells it)."""
        timer = asyncio.get_running_loop().call_later(RELEASE_UNTOLD_AFTER, self._release_untold, elicitation_id)
        self._untold[elicitation_id] = completed_at, timer

    def _release_untold(self, elicitation_id: str) -> None:
        if self._untold.pop(elicitation_id, None) is None:
            return  # its telling started
        task = asyncio.get_running_loop().create_task(self._release(elicitation_id))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, elicitation_id: str) -> None:
        try:
            await self.store.elicitations.release_telling(elicitation_id)
        except Exception as exc:  # left delivering: settled undeliverable when this replica is gone
            log.warning("giving back an untold completion failed: %s", type(exc).__name__)

    async def settle_telling(self, elicitation_id: str, *, sent: bool) -> bool:
        """Record how a telling this replica took went: sent, or undeliverable (the connection is gone), audited.
        False when it was settled meanwhile (this replica was presumed gone)."""
        outcome = CompletionDelivery.SENT if sent else CompletionDelivery.UNDELIVERABLE
        told = AuditEntry(
            "completion_sent" if sent else "completion_undeliverable",
            self.now(),
            elicitation_id=elicitation_id,
            detail={} if sent else {"reason": CONNECTION_CLOSED},
        )
        return await self.store.elicitations.settle_completion(elicitation_id, outcome, audit=told)

    # -- audit ------------------------------------------------------------------------------------------
    def entry(
        self, record: ElicitationRecord, event: str, detail: Mapping[str, object] | None, now: datetime
    ) -> AuditEntry:
        """The audit event `event` about `record` (its id, bound identity and provider), to write with a change."""
        return AuditEntry(event, now, record.id, record.identity, record.provider, detail)

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

    async def unsupported_client(
        self, user: Identity, provider: str, *, detail: Mapping[str, object] | None = None
    ) -> None:
        """Audit a request nobody could be asked for: the client does not take URL-mode elicitations."""
        await self.store.audit.record(
            "unsupported_client", identity=user, provider=provider, detail=detail, now=self.now()
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
