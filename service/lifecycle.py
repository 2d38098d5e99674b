"""Ending an elicitation: one terminal transition, its audit line and the wake-up call, together.

Also owns the audit line about one elicitation (`audit_elicitation`), which names its id, bound identity and provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from .events import ElicitationEvent
from .runtime import Runtime
from .states import ElicitationStatus
from .store import ElicitationRecord

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection  # the connection of a Store.transaction()


async def audit_elicitation(
    rt: Runtime,
    record: ElicitationRecord,
    event: str,
    *,
    detail: Mapping[str, object] | None = None,
    now: datetime | None = None,
    conn: AsyncConnection | None = None,
) -> None:
    """Record an audit event about `record` (its id, bound identity and provider); `now` defaults to `rt.now()`."""
    await rt.store.audit.record(
        event,
        elicitation_id=record.id,
        identity=record.identity,
        provider=record.provider,
        detail=detail,
        now=rt.now() if now is None else now,
        conn=conn,
    )


async def finish(
    rt: Runtime,
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
    now = rt.now()
    async with rt.store.transaction() as conn:
        updated = await rt.store.elicitations.transition(record.id, status, reason=reason, now=now, conn=conn)
        if updated is None:
            return False
        if close_flows:
            await rt.store.flows.invalidate_open(record.id, now, conn=conn)
        await audit_elicitation(rt, record, event, detail={"reason": reason, **(detail or {})}, now=now, conn=conn)
    rt.bus.publish(ElicitationEvent(record.id, status, record.connection_key))
    return True
