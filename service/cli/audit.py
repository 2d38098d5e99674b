"""`acp-connector audit list`: the audit trail, filtered by user, provider, event and time, newest first, in keyset
pages (text, --json, or --csv as the console's export)."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .framework import Commands, Invocation, UsageError
from .operating import add_paging, audit_json, checked_limit, print_page

if TYPE_CHECKING:
    from ..core.paging import Page
    from ..core.records import AuditRecord
    from ..store import Store


def register(commands: Commands) -> None:
    group = commands.group(
        "audit",
        help="the audit trail",
        description="Audit events as stored (never a secret): what happened, to whom, at which provider, when.",
    )
    listing = group.command(
        "list",
        run_list,
        help="list audit events, newest first",
        description=(
            "Audit events matching every filter given, newest first. Times are ISO 8601 (UTC without an offset).\n"
            "Keyset pages: --after the `next` cursor of the previous page."
        ),
        examples=[
            "acp-connector audit list --user alice --event disconnected --json",
            "acp-connector audit list --provider github --since 2026-12-01 --until 2026-12-02 --csv",
        ],
    )
    listing.add_argument("--user", metavar="SUBJECT", help="only events about this user")
    listing.add_argument("--provider", metavar="NAME", help="only events at this provider")
    listing.add_argument("--event", metavar="NAME", help="only this event (docs/reference.md lists them)")
    listing.add_argument("--since", metavar="TIME", help="events at or after this time")
    listing.add_argument("--until", metavar="TIME", help="events before this time")
    listing.add_argument("--csv", action="store_true", help="CSV rows (the console's export)")
    add_paging(listing)


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"{name}: not an ISO 8601 date or time: {value!r}", "e.g. 2026-12-01 or 2026-12-01T08:00"
        ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def run_list(invocation: Invocation) -> int:
    from ..core.errors import FlowRefused
    from ..core.paging import Position
    from ..store import AuditFilter

    args = invocation.args
    limit = checked_limit(invocation)
    where = AuditFilter(
        subject=args.user,
        provider=args.provider,
        event=args.event,
        since=_time(args.since, "--since"),
        until=_time(args.until, "--until"),
    )

    async def read(store: Store) -> Page[AuditRecord]:
        return await store.console.audit(where, after=Position.decode(args.after), limit=limit)

    try:
        page = invocation.with_store(read)
    except FlowRefused as exc:
        raise UsageError("--after: the cursor cannot be read", "pass the `next` value of the previous page") from exc
    if args.json:
        print_page(invocation, page, audit_json)
        return 0
    if args.csv:
        writer = csv.writer(invocation.stdout)
        writer.writerow(["id", "at", "event", "elicitation_id", "issuer", "subject", "provider", "detail"])
        for r in page.items:
            identity = r.identity
            writer.writerow(
                [
                    r.id,
                    r.at.isoformat(),
                    r.event,
                    r.elicitation_id or "",
                    identity.issuer if identity else "",
                    identity.subject if identity else "",
                    r.provider or "",
                    json.dumps(r.detail, sort_keys=True),
                ]
            )
    else:
        rows = [("AT", "EVENT", "SUBJECT", "PROVIDER", "ELICITATION", "DETAIL")]
        for r in page.items:
            rows.append(
                (
                    r.at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    r.event,
                    r.identity.subject if r.identity else "-",
                    r.provider or "-",
                    r.elicitation_id or "-",
                    json.dumps(r.detail, sort_keys=True),
                )
            )
        invocation.table(rows)
    if page.next is not None:
        invocation.note(f"more follow: --after {page.next}")
    return 0
