"""`acp-connector purge`: apply the retention policy now, or show what it would delete (`--dry-run`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from ..app import pool_settings, retention_policy
from ..config import Settings
from ..core.retention import PurgeKind, count_due, purge_due
from ..store import Store
from .framework import Commands, Invocation

WHAT = {
    PurgeKind.ELICITATIONS: ("elicitation_days", "ended elicitations (with their OAuth flows and verifications)"),
    PurgeKind.VERIFICATIONS: ("verification_days", "identity verifications"),
    PurgeKind.AUDIT: ("audit_days", "audit events"),
    PurgeKind.EVENTS: ("event_days", "event-log rows"),
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
            "event-log rows older than retention.event_days. A window of 0 days keeps that kind forever. Grants\n"
            "are never deleted by retention. The running service does the same every retention.interval_seconds;\n"
            "this command does it now. With --dry-run it only counts."
        ),
        examples=["acp-connector purge --dry-run", "acp-connector purge"],
    )
    command.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")


def run(invocation: Invocation) -> int:
    settings = invocation.settings()
    dry_run = bool(invocation.args.dry_run)
    counts = asyncio.run(_purge(settings, dry_run=dry_run))
    policy = retention_policy(settings)
    verb = "would delete" if dry_run else "deleted"
    for kind, (key, what) in WHAT.items():
        days = getattr(policy, key)
        if kind in counts:
            invocation.out(f"{kind.value}: {verb} {counts[kind]} {what} older than {days} days (retention.{key})")
        else:
            invocation.out(f"{kind.value}: kept forever (retention.{key} = 0)")
    invocation.out("grants: never deleted by retention")
    return 0


async def _purge(settings: Settings, *, dry_run: bool) -> dict[PurgeKind, int]:
    store = Store.from_url(settings.database.url, pool_settings(settings))
    try:
        await store.check_schema()
        policy, now = retention_policy(settings), datetime.now(UTC)
        if dry_run:
            return await count_due(store.retention, policy, now)
        return await purge_due(store.retention, policy, now)
    finally:
        await store.close()
