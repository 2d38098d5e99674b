"""How long ended elicitations, identity verifications, audit events, event-log rows and ended webhook deliveries
are kept.

The sweeper applies the policy in small batches; `acp-connector purge` applies it (or, with `--dry-run`, counts
what it would delete) on demand. Grants are not covered: a grant lives until it is disconnected.
"""

from __future__ import annotations

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
    """Days to keep each kind (0: keep forever), and the size of one delete batch."""

    elicitation_days: int = 30
    verification_days: int = 7
    audit_days: int = 365
    event_days: int = 7
    webhook_delivery_days: int = 7
    batch_size: int = 500

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


async def purge_due(
    repo: RetentionRepo, policy: RetentionPolicy, now: datetime, *, max_batches: int | None = None
) -> dict[PurgeKind, int]:
    """Delete what is past its window, batch by batch (at most `max_batches` per kind); how many per kind."""
    deleted: dict[PurgeKind, int] = {}
    for kind, window in policy.windows().items():
        total, batches = 0, 0
        while max_batches is None or batches < max_batches:
            removed = await repo.purge(kind, now - window, limit=policy.batch_size)
            total += removed
            batches += 1
            if removed < policy.batch_size:
                break
        deleted[kind] = total
    return deleted


async def count_due(repo: RetentionRepo, policy: RetentionPolicy, now: datetime) -> dict[PurgeKind, int]:
    """What `purge_due` would delete now, per kind (nothing is deleted)."""
    return {kind: await repo.count(kind, now - window) for kind, window in policy.windows().items()}
