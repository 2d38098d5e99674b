"""Ending an elicitation: one terminal transition, its audit line and the wake-up call, together."""

from __future__ import annotations

from collections.abc import Mapping

from .events import ElicitationEvent
from .runtime import Runtime
from .states import ElicitationStatus
from .store import ElicitationRecord


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
        await rt.store.audit.record(
            event,
            elicitation_id=record.id,
            identity=record.identity,
            provider=record.provider,
            detail={"reason": reason, **(detail or {})},
            now=now,
            conn=conn,
        )
    rt.bus.publish(ElicitationEvent(record.id, status, record.connection_key))
    return True
