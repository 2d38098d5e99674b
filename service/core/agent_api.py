"""The `/v1` API's face of the lifecycle: an agent in any language drives its elicitations over HTTP.

The agent authenticates with an API key bound to a tenant (the agent) and an optional provider allow-list. It
creates an elicitation here, sends `elicitation/create` on its own ACP connection, reports the client's answer,
and learns the outcome by waiting (or from the event stream). Every change goes through `Elicitations`, the
same lifecycle the embedded API uses. An elicitation of another tenant, or one not made through this API, is
"unknown" here.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .answers import ClientAnswer
from .errors import AccountChoiceNeeded, ConnectorError, FlowRefused, account_choice_refused
from .handles import api_key_hash, new_id
from .identity import Identity
from .lifecycle import Elicitations, GrantsSeen
from .outcomes import AuthorizationOutcome, StopCause
from .ports import ApiStore, EventSource, Tx
from .records import ApiElicitationRecord, ApiKeyRecord, ElicitationRecord, GrantRecord
from .scopes import ElicitationScope, RequestScope, SessionScope
from .tenants import EMBEDDED_TENANT, TENANT_PATTERN

API_KEY_PREFIX = "acpk_"
PROVIDER_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# The longest a long-poll may hold a request; clients ask again after it.
MAX_WAIT_SECONDS = 60.0
# A live key is believed this long without a database read (a revocation takes effect within this time).
KEY_CACHE_SECONDS = 5.0
KEY_CACHE_SIZE = 1024


def new_api_key(
    tenant: str, agent_name: str, providers: Sequence[str] | None, now: datetime
) -> tuple[str, ApiKeyRecord]:
    """A new key (shown once) and the record that stores only its hash."""
    if not TENANT_PATTERN.fullmatch(tenant):
        raise ValueError("a tenant is 1-64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit")
    if tenant == EMBEDDED_TENANT:
        raise ValueError(
            f"'{EMBEDDED_TENANT}' is the embedded connector's own tenant; share its grants with [tenants] shared_groups"
        )
    if not agent_name.strip() or len(agent_name) > 255 or not agent_name.isprintable():
        raise ValueError("the agent name must be 1-255 printable characters")
    for name in providers or ():
        if not PROVIDER_PATTERN.fullmatch(name):
            raise ValueError(f"'{name}' is not a provider name")
    key_id = "ak_" + new_id(9)
    key = f"{API_KEY_PREFIX}{key_id}_{new_id(32)}"
    record = ApiKeyRecord(
        id=key_id,
        key_hash=api_key_hash(key),
        tenant=tenant,
        agent_name=agent_name.strip(),
        providers=None if providers is None else tuple(dict.fromkeys(providers)),
        created_at=now,
        revoked_at=None,
    )
    return key, record


@dataclass(frozen=True, slots=True)
class Created:
    """What creating gave: a new (or, for a repeated idempotency key, the earlier) elicitation, or a grant that
    settles the request without asking (it covers the scopes, or lacks only scopes refused when it was made:
    `refused_scopes`, as the embedded API's `narrowed`), or neither (asked for grants only)."""

    elicitation: ElicitationRecord | None = None
    owner: ApiElicitationRecord | None = None
    grant: GrantRecord | None = None
    replayed: bool = False
    refused_scopes: tuple[str, ...] = ()
    unsupported: bool = False  # nothing settles it and the client cannot be asked (recorded as on the embedded path)


class _Replayed(Exception):
    """Another request with the same idempotency key won the race: roll back and answer with its elicitation."""


class AgentApi:
    def __init__(
        self, elicitations: Elicitations, store: ApiStore, events: EventSource, clock: Callable[[], datetime]
    ) -> None:
        self.elicitations = elicitations
        self.store = store
        self.events = events
        self.now = clock
        self._keys: dict[str, tuple[ApiKeyRecord, float]] = {}  # by key hash: live keys and until when

    # -- who calls ----------------------------------------------------------------------------------------
    async def authenticate(self, key: str | None) -> ApiKeyRecord:
        """The live key presented, or FlowRefused `unauthorized` (missing, unknown or revoked)."""
        if not key or not key.startswith(API_KEY_PREFIX) or len(key) > 200 or not key.isascii():
            raise FlowRefused("unauthorized")
        digest = api_key_hash(key)
        now = time.monotonic()
        cached = self._keys.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        record = await self.store.api_keys.by_hash(digest)
        if record is None or record.revoked_at is not None:
            self._keys.pop(digest, None)
            raise FlowRefused("unauthorized")
        if len(self._keys) >= KEY_CACHE_SIZE:  # only live keys are cached: the operator bounds how many exist
            self._keys.pop(next(iter(self._keys)))
        self._keys[digest] = (record, now + KEY_CACHE_SECONDS)
        return record

    def tenants_seen(self, caller: ApiKeyRecord) -> frozenset[str]:
        """The tenants whose grants `caller` sees, uses and revokes: its own, and those it shares with."""
        return self.elicitations.sharing.visible(caller.tenant)

    def check_provider(self, caller: ApiKeyRecord, provider: str) -> None:
        if not PROVIDER_PATTERN.fullmatch(provider):
            raise FlowRefused("unknown_provider", detail={"message": "There is no provider by that name."})
        if not caller.allows(provider):
            raise FlowRefused("provider_not_allowed")

    # -- elicitations -------------------------------------------------------------------------------------
    async def create(
        self,
        caller: ApiKeyRecord,
        *,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None,
        scope: ElicitationScope,
        message: str | None,
        idempotency_key: str | None,
        connection_id: str | None,
        ask_again: bool = False,
        grants_only: bool = False,
        url_mode: bool = True,
        connection: Mapping[str, str] | None = None,
        account: str | None = None,
    ) -> Created:
        """A grant that already covers the scopes (or, unless `ask_again`, lacks only scopes the provider refused
        when it was made: asking would ask the user the same again), else a new pending elicitation bound to `user`.

        A repeated idempotency key answers with the elicitation it created first, if the request is the same,
        and `idempotency_conflict` if it is not. `grants_only` creates nothing: without a grant that settles the
        request, the answer is empty. Without `url_mode` (the client cannot take a URL-mode elicitation) nothing is
        created either, and an unsettled request is audited `unsupported_client`, as on the embedded path.
        `account` names the user's account meant (`service.core.accounts`): without it, a user holding several at
        the provider is refused `account_choice_needed` (naming them by label); one not held yet is a new account.
        """
        self.check_provider(caller, provider)
        grants_only = grants_only or not url_mode
        if idempotency_key is not None and not grants_only:
            earlier = await self.store.api_elicitations.by_idempotency_key(caller.tenant, idempotency_key)
            if earlier is not None:
                return await self._replay(earlier, user, provider, scopes, scope, connection_id)
        try:  # resolved even when the scopes are given: an unknown or unusable provider is refused here
            default_scopes = await self.elicitations.default_scopes(provider)
        except ConnectorError as exc:
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        wanted = tuple(scopes) if scopes is not None else default_scopes
        seen = GrantsSeen()  # the grants read here serve the answer and the create below (no second read)
        answered = await self._settled(caller, user, provider, wanted, ask_again, connection, account, seen)
        if answered is not None:
            return answered
        if not url_mode:
            await self.elicitations.unsupported_client(user, provider, detail={"tenant": caller.tenant, "via": "api"})
            return Created(unsupported=True)
        if grants_only:
            return Created()
        now = self.now()
        owner: ApiElicitationRecord | None = None

        async def bind(record: ElicitationRecord, tx: Tx) -> None:
            nonlocal owner
            owner = ApiElicitationRecord(record.id, caller.tenant, idempotency_key, connection_id, now, None)
            if not await self.store.api_elicitations.claim(owner, conn=tx):
                raise _Replayed

        try:
            record = await self.elicitations.create(
                connection_key=connection_key(caller.tenant, connection_id),
                user=user,
                provider=provider,
                scopes=wanted,
                scope=scope,
                message=message,
                agent_name=caller.agent_name,
                within=bind,
                connection=connection,
                account=account,
                seen=seen,
            )
        except AccountChoiceNeeded as exc:  # a second account stored since `settled` read
            raise account_choice_refused(exc) from None
        except _Replayed:
            assert idempotency_key is not None
            earlier = await self.store.api_elicitations.by_idempotency_key(caller.tenant, idempotency_key)
            assert earlier is not None
            return await self._replay(earlier, user, provider, scopes, scope, connection_id)
        return Created(elicitation=record, owner=owner)

    async def _settled(
        self,
        caller: ApiKeyRecord,
        user: Identity,
        provider: str,
        wanted: Sequence[str],
        ask_again: bool,
        connection: Mapping[str, str] | None,
        account: str | None,
        seen: GrantsSeen,
    ) -> Created | None:
        """The answer stored grants give (`Elicitations.settled`), with the grant as read into `seen`, or None;
        `account_choice_needed` when no account is named and the user holds several."""
        try:
            settled = await self.elicitations.settled(
                user,
                provider,
                wanted,
                ask_again=ask_again,
                connection=connection,
                tenant=caller.tenant,
                seen=seen,
                account=account,
            )
        except AccountChoiceNeeded as exc:
            raise account_choice_refused(exc) from None
        wanted_id = settled.grant.id if settled and settled.grant else None
        grant = next((g for g in seen.grants or () if g.id == wanted_id), None)
        if settled is None or grant is None:
            return None
        return Created(grant=grant, refused_scopes=settled.refused_scopes)

    async def _replay(
        self,
        earlier: ApiElicitationRecord,
        user: Identity,
        provider: str,
        scopes: Sequence[str] | None,
        scope: ElicitationScope,
        connection_id: str | None,
    ) -> Created:
        record = await self.elicitations.get(earlier.elicitation_id)
        assert record is not None  # the API row is deleted with its elicitation
        same = (
            record.identity == user
            and record.provider == provider
            and (scopes is None or tuple(scopes) == record.scopes)
            and scope_of(record) == scope
            and earlier.connection_id == connection_id
        )
        if not same:
            raise FlowRefused("idempotency_conflict")
        return Created(elicitation=record, owner=earlier, replayed=True)

    async def find(self, caller: ApiKeyRecord, elicitation_id: str) -> tuple[ElicitationRecord, ApiElicitationRecord]:
        """The caller's elicitation, brought up to date (expired if its time is up); `unknown_elicitation` else."""
        owner = await self.store.api_elicitations.get(elicitation_id)
        record = await self.elicitations.get(elicitation_id) if owner is not None else None
        if owner is None or record is None or owner.tenant != caller.tenant:
            raise FlowRefused("unknown_elicitation")
        return await self.elicitations.expire_if_due(record), owner

    async def answer(
        self, caller: ApiKeyRecord, elicitation_id: str, answer: ClientAnswer
    ) -> tuple[ElicitationRecord, ApiElicitationRecord, AuthorizationOutcome | None]:
        """Record how the client answered `elicitation/create`; each elicitation takes one answer.

        With the state, the outcome the answer led to (None for accept: the browser decides then).
        """
        record, _owner = await self.find(caller, elicitation_id)
        if not await self.store.api_elicitations.mark_answered(record.id, self.now()):
            raise FlowRefused("already_answered")
        outcome = await self.elicitations.answered(record, answer)
        return (*await self.find(caller, elicitation_id), outcome)

    async def wait(
        self, caller: ApiKeyRecord, elicitation_id: str, seconds: float
    ) -> tuple[ElicitationRecord, ApiElicitationRecord]:
        """The elicitation once it has ended, or as it stands after `seconds` (at most MAX_WAIT_SECONDS)."""
        found = await self.find(caller, elicitation_id)
        if found[0].status.terminal or seconds <= 0:
            return found
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(seconds, MAX_WAIT_SECONDS)
        while True:
            # Registered before the re-read, so an end that lands in between still wakes us. Ends made by other
            # processes reach the bus through the event-log feed, which runs while anyone waits.
            with self.events.waiter(elicitation_id) as ended:
                record, owner = await self.find(caller, elicitation_id)
                left = deadline - loop.time()
                if record.status.terminal or left <= 0:
                    return record, owner
                until_expiry = (record.expires_at - self.now()).total_seconds()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(ended), timeout=max(0.0, min(left, until_expiry)))

    async def cancel(
        self,
        caller: ApiKeyRecord,
        elicitation_id: str,
        cause: StopCause = StopCause.AGENT,
        *,
        request_cancelled: bool | None = None,
    ) -> tuple[ElicitationRecord, ApiElicitationRecord]:
        """End an open elicitation as cancelled for `cause` (stored as on the embedded path: a client that
        disconnected reads `disconnected`); `already_ended` else.

        As on the embedded path, a flow the user already started at the provider stays usable: a grant the user
        completes afterwards is stored, but the elicitation stays cancelled.
        """
        record, _owner = await self.find(caller, elicitation_id)
        ended = record.status.terminal or not await self.elicitations.cancel(
            record, cause, request_cancelled=request_cancelled, via="api"
        )
        if ended:
            raise FlowRefused("already_ended")
        return await self.find(caller, elicitation_id)


def connection_key(tenant: str, connection_id: str | None) -> str:
    """The connection key of an API-created elicitation: it names the tenant, so events can be routed by it."""
    return f"v1:{tenant}:{connection_id or ''}"


def tenant_of(connection_key: str) -> str | None:
    """The tenant an event's connection key names (None for an elicitation of the embedded API)."""
    if not connection_key.startswith("v1:"):
        return None
    return connection_key[3:].partition(":")[0]


def connection_id_of(connection_key: str) -> str | None:
    """The agent's own label of an API elicitation's connection (None for none, or an embedded connection)."""
    parts = connection_key.split(":", 2)
    return parts[2] or None if len(parts) == 3 and parts[0] == "v1" else None


def scope_of(record: ElicitationRecord) -> ElicitationScope:
    if record.scope_kind == "session" and record.session_id is not None:
        return SessionScope(record.session_id, record.tool_call_id)
    assert record.request_id is not None
    return RequestScope(record.request_id)
