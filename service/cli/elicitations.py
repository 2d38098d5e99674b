"""`acp-connector elicitations list|cancel`: pending and recent elicitations, and cancelling one as the console
does (its agent is told; audited with the CLI's operator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .framework import Commands, Invocation, UsageError
from .operating import add_paging, checked_limit, cli_operator, elicitation_json, print_json, print_page, with_console

if TYPE_CHECKING:
    from ..console import Console
    from ..core.paging import Page
    from ..core.records import ElicitationRecord


def register(commands: Commands) -> None:
    group = commands.group(
        "elicitations",
        help="pending and recent elicitations (authorization links)",
        description="Elicitations as stored: who, which provider, which agent (tenant), their status. No secret.",
    )
    listing = group.command(
        "list",
        run_list,
        help="list elicitations, newest first",
        description=(
            "One line per elicitation, newest first: the open ones (pending, consented, verified, authorizing),\n"
            "or with --recent every one. Keyset pages: --after the `next` cursor of the previous page."
        ),
        examples=["acp-connector elicitations list --json", "acp-connector elicitations list --recent --user alice"],
    )
    listing.add_argument("--recent", action="store_true", help="every elicitation, not only the open ones")
    listing.add_argument("--user", metavar="SUBJECT", help="only this user's")
    add_paging(listing)
    cancel = group.command(
        "cancel",
        run_cancel,
        help="cancel one open elicitation",
        description=(
            'Ends an open elicitation as cancelled ("cancelled by an operator"): the link stops working and its\n'
            "agent is told. Audited as `cancelled` with the operator (cli:<your user name>)."
        ),
        examples=["acp-connector elicitations cancel 9Jr2... --json"],
    )
    cancel.add_argument("elicitation_id", metavar="ELICITATION_ID")
    cancel.add_argument("--json", action="store_true", help='{"elicitationId", "cancelled": true|false}')


def run_list(invocation: Invocation) -> int:
    from ..core.errors import FlowRefused

    args = invocation.args
    limit = checked_limit(invocation)

    async def read(console: Console) -> Page[tuple[ElicitationRecord, str | None]]:
        return await console.elicitations_page(
            pending=not args.recent, after=args.after, limit=limit, subject=args.user
        )

    try:
        page = with_console(invocation, read)
    except FlowRefused as exc:
        raise UsageError("--after: the cursor cannot be read", "pass the `next` value of the previous page") from exc
    if args.json:
        print_page(invocation, page, lambda row: elicitation_json(*row))
        return 0
    rows = [("ID", "SUBJECT", "PROVIDER", "AGENT", "TENANT", "STATUS", "CREATED", "EXPIRES")]
    for record, tenant in page.items:
        rows.append(
            (
                record.id,
                record.identity.subject,
                record.provider,
                record.agent_name,
                tenant or "embedded",
                record.status.value,
                record.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                record.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        )
    invocation.table(rows)
    if page.next is not None:
        invocation.note(f"more follow: --after {page.next}")
    return 0


def run_cancel(invocation: Invocation) -> int:
    from ..core.errors import FlowRefused

    elicitation_id = invocation.args.elicitation_id
    try:
        cancelled = with_console(invocation, lambda c: c.cancel_elicitation(elicitation_id, cli_operator()))
    except FlowRefused as exc:  # not_found
        raise UsageError(f"no elicitation {elicitation_id}", "take the id from elicitations list") from exc
    if invocation.args.json:
        print_json(invocation, {"elicitationId": elicitation_id, "cancelled": cancelled})
    else:
        invocation.out(f"cancelled {elicitation_id}" if cancelled else f"{elicitation_id} had ended: nothing done")
    return 0 if cancelled else 1
