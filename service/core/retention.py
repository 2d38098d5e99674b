"""How long ended elicitations, identity verifications, audit events, event-log rows and ended webhook deliveries
are kept.

The sweeper applies the policy in small batches; `acp-connector purge` applies it (or, with `--dry-run`, counts
what it would delete) on demand. Grants are not covered: a grant lives until it is disconnected.

A batch is one transaction, and it holds row locks and a connection while it runs, so its size follows its measured
time (`BatchSizer`): each kind starts small, and each next batch is sized in proportion to how far the last one was
from the target (growing at most twofold, up to `batch_size`). What a row costs to delete varies by kind (an
elicitation's OAuth flows and verifications go with it by cascade), by the table's indexes and by the machine's
load; the target does not. After each batch the purge rests as long as the batch took, so that retention takes at
most half of the database's time it could (a purge of a million rows beside running flows raised their p99 1.6x
without the rest).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol


class PurgeKind(StrEnum):
    ELICITATIONS = "elicitations"  # ended ones, with their OAuth flows and identity verifications
    VERIFICATIONS = "verifications"  # identity-verification rows (expired)
    AUDIT = "audit_events"
    EVENTS = "elicitation_events"  # the event log (outbox)
    WEBHOOK_DELIVERIES = "webhook_deliveries"  # ended ones (delivered or failed), with their attempts


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Days to keep each kind (0: keep forever), the most rows one delete batch takes, and the time a batch aims at."""

    elicitation_days: int = 30
    verification_days: int = 7
    audit_days: int = 365
    event_days: int = 7
    webhook_delivery_days: int = 7
    batch_size: int = 500
    batch_target_seconds: float = 0.03

    def windows(self) -> dict[PurgeKind, timedelta]:
        """The kinds this policy purges, each with how long its rows are kept."""
        days = {
            PurgeKind.ELICITATIONS: self.elicitation_days,
            PurgeKind.VERIFICATIONS: self.verification_days,
            PurgeKind.AUDIT: self.audit_days,
            PurgeKind.EVENTS: self.event_days,
            PurgeKind.WEBHOOK_DELIVERIES: self.webhook_delivery_days,
        }
        return {kind: timedelta(days=n) for kind, n in days.items() if n > 0}


class RetentionRepo(Protocol):
    async def count(self, kind: PurgeKind, before: datetime) -> int: ...
    async def purge(self, kind: PurgeKind, before: datetime, *, limit: int) -> int: ...


MIN_BATCH = 10


FIRST_BATCH = 50


class BatchSizer:
    """The next batch's size from the last one's time, in proportion to how far it was from `target` seconds (at
    most twice the last size: a batch also costs a fixed round trip, so its time is not quite proportional to its
    rows); between `MIN_BATCH` (or `most`, if smaller) and `most`, starting at `FIRST_BATCH`."""

    def __init__(self, most: int, target: float) -> None:
        self.most = most
        self.least = min(MIN_BATCH, most)
        self.target = target
        self.size = min(FIRST_BATCH, most)

    def took(self, seconds: float) -> None:
        wanted = self.size * 2 if seconds <= 0 else int(self.size * min(2.0, self.target / seconds))
        self.size = max(self.least, min(self.most, wanted))


async def purge_due(
    repo: RetentionRepo,
    policy: RetentionPolicy,
    now: datetime,
    *,
    max_batches: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    rest: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[PurgeKind, int]:
    """Delete what is past its window, batch by batch (at most `max_batches` per kind), each batch sized by the last
    one's time (`BatchSizer`) and followed by a rest as long; how many per kind."""
    deleted: dict[PurgeKind, int] = {}
    for kind, window in policy.windows().items():
        sizer = BatchSizer(policy.batch_size, policy.batch_target_seconds)
        total, batches = 0, 0
        while max_batches is None or batches < max_batches:
            limit = sizer.size
            started = clock()
            removed = await repo.purge(kind, now - window, limit=limit)
            took = clock() - started
            sizer.took(took)
            total += removed
            batches += 1
            if removed < limit or batches == max_batches:
                break
            await rest(took)
        deleted[kind] = total
    return deleted


async def count_due(repo: RetentionRepo, policy: RetentionPolicy, now: datetime) -> dict[PurgeKind, int]:
    """What `purge_due` would delete now, per kind (nothing is deleted)."""
    return {kind: await repo.count(kind, now - window) for kind, window in policy.windows().items()}
