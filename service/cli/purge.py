"""`acp-connector purge`: apply the retention policy now, or show what it would delete (`--dry-run`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..core.retention import PurgeKind, count_due, purge_due
from .framework import Commands, Invocation

if TYPE_CHECKING:
    from ..store import Store

WHAT = {
    PurgeKind.ELICITATIONS: ("elicitation_days", "ended elicitations (with their OAuth flows and verifications)"),
    PurgeKind.VERIFICATIONS: ("verification_days", "identity verifications"),
    PurgeKind.AUDIT: ("audit_days", "audit events"),
    PurgeKind.EVENTS: ("event_days", "event-log rows"),
    PurgeKind.WEBHOOK_DELIVERIES: ("webhook_delivery_days", "ended webhook deliveries (with their attempts)"),
}


def register(commands: Commands) -> None:
    command = commands.command(
        "purge",
        run,
        help="delete what is past its retention window ([retention])",
        description=(
            "Delete, in batches, what the [retention] settings no longer keep: ended elicitations not changed for\n"
            "retention.elicitation_days (their OAuth flows and identity verifications go with them), identity\n"
            "verifications expired retention.verification_days ago, audit events older than retention.audit_days,\n"
            "event-log rows older than retention.event_days, webhook deliveries that ended (delivered or failed)\n"
            "more than retention.webhook_delivery_days ago, with their attempts (a pending one never). A window\n"
            "of 0 days keeps that kind forever. Grants are never deleted by retention. The running service does\n"
            "the same every retention.interval_seconds; this command does it now. With --dry-run it only counts."
        ),
        examples=["acp-connector purge --dry-run", "acp-connector purge"],
    )
    command.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")


def run(invocation: Invocation) -> int:
    policy = invocation.settings().retention.policy()
    dry_run = bool(invocation.args.dry_run)

    async def purge(store: Store) -> dict[PurgeKind, int]:
        now = datetime.now(UTC)
        if dry_run:
            return await count_due(store.retention, policy, now)
        return await purge_due(store.retention, policy, now)

    counts = invocation.with_store(purge)
    verb = "would delete" if dry_run else "deleted"
    for kind, (key, what) in WHAT.items():
        days = getattr(policy, key)
        if kind in counts:
            invocation.out(f"{kind.value}: {verb} {counts[kind]} {what} older than {days} days (retention.{key})")
        else:
            invocation.out(f"{kind.value}: kept forever (retention.{key} = 0)")
    invocation.out("grants: never deleted by retention")
    return 0
