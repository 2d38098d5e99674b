"""`acp-connector grants list|revoke`: users' grants as stored (metadata only: never a token), and revoking one as
the console does (audited with the CLI's operator)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from ..core.paging import Page, Position
from .framework import Commands, Invocation, UsageError

if TYPE_CHECKING:
    from ..core.records import GrantRecord
    from ..store import Store

T = TypeVar("T")

LIMIT = 1000


def register(commands: Commands) -> None:
    grants = commands.group(
        "grants",
        help="users' grants (metadata only)",
        description="Grants as stored: who, which provider account, scopes, token expiry. Never a token.",
    )
    listing = grants.command(
        "list",
        run_list,
        help="list grants, newest first",
        description=(
            "One line per grant (at most 1000, newest first): its id, the user (issuer and subject), provider,\n"
            "account, scopes, when its access token expires, its status (active; needs_user with the reason code:\n"
            "revoked, account_changed, key_rejected; expired: no_refresh_token), the last refresh that succeeded,\n"
            "and a note: when a refresh may next be tried after transient failures, or when it was stored without\n"
            "the refresh token it was asked with (offline_access): it will need the user again at that expiry."
        ),
        examples=["acp-connector grants list --user alice --provider github"],
    )
    listing.add_argument("--user", metavar="SUBJECT", help="only this user's (their subject at the identity issuer)")
    listing.add_argument("--issuer", help="only users of this identity issuer")
    listing.add_argument("--provider", metavar="NAME", help="only grants at this provider")
    listing.add_argument("--tenant", help="only grants made through this tenant (an API key's, or embedded)")
    listing.add_argument(
        "--status",
        choices=("needs_user", "failing"),
        help="only grants needing the user, or backing off after refresh failures",
    )
    listing.add_argument("--after", metavar="CURSOR", help="continue after this cursor (the `next` of a --json page)")
    listing.add_argument("--limit", type=int, default=LIMIT, help=f"rows (1-{LIMIT}, default {LIMIT})")
    listing.add_argument("--json", action="store_true", help="one JSON object: {items, next} (keyset paging)")
    revoke = grants.command(
        "revoke",
        run_revoke,
        help="revoke one grant at its provider and delete it",
        description=(
            "Asks the provider to revoke the grant's tokens (where it offers revocation), deletes the grant and\n"
            "records `disconnected` in the audit trail with the operator (cli:<your user name>). The agent's\n"
            "event stream and webhooks say grant.revoked or grant.deleted."
        ),
        examples=["acp-connector grants revoke 3J7vQm0bL2xYc9Tk --json"],
    )
    revoke.add_argument("grant_id", metavar="GRANT_ID", help="the grant's id (from grants list)")
    revoke.add_argument("--json", action="store_true", help='{"grantId", "revoked": true|false}')


def run_list(invocation: Invocation) -> int:
    from ..store import GrantFilter
    from .operating import checked_limit, grant_json, print_page

    args = invocation.args
    limit = checked_limit(invocation)
    where = GrantFilter(
        subject=args.user, issuer=args.issuer, provider=args.provider, status=args.status, tenant=args.tenant
    )

    async def read(store: Store) -> Page[GrantRecord]:
        return await store.console.grants(where, after=Position.decode(args.after), limit=limit)

    page = _refusals(lambda: invocation.with_store(read))
    now = datetime.now(UTC)
    if args.json:
        print_page(invocation, page, lambda grant: grant_json(grant, now))
        return 0
    rows = [
        ("ID", "ISSUER", "SUBJECT", "PROVIDER", "ACCOUNT", "LABEL", "SCOPES", "EXPIRES", "STATUS", "REFRESHED", "NOTE")
    ]
    for grant in page.items:
        status, reason = grant.status_at(now)
        rows.append(
            (
                grant.id,
                grant.identity.issuer,
                grant.identity.subject,
                grant.provider,
                grant.provider_account_id,
                grant.account_label or "-",
                ",".join(grant.scopes) or "-",
                _time(grant.token_expires_at),
                status.value if reason is None else f"{status.value}:{reason.value}",
                _time(grant.health.last_refresh_at),
                _note(grant, now) or "-",
            )
        )
    invocation.table(rows)
    if page.next is not None:
        invocation.note(f"more grants follow: --after {page.next} (or narrow with --user, --issuer or --provider)")
    return 0


def run_revoke(invocation: Invocation) -> int:
    from .operating import cli_operator, print_json, with_console

    grant_id = invocation.args.grant_id
    revoked = with_console(invocation, lambda console: console.revoke_grant(grant_id, cli_operator()))
    if invocation.args.json:
        print_json(invocation, {"grantId": grant_id, "revoked": revoked})
    else:
        invocation.out(f"revoked and deleted grant {grant_id}" if revoked else f"no grant {grant_id}: nothing done")
    return 0 if revoked else 1


def _refusals(read: Callable[[], T]) -> T:
    """A bad cursor is a usage error (exit 2), not a traceback."""
    from ..core.errors import FlowRefused

    try:
        return read()
    except FlowRefused as exc:
        raise UsageError("--after: the cursor cannot be read", "pass the `next` value of the previous page") from exc


def _time(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else "-"


def _note(grant: GrantRecord, now: datetime) -> str | None:
    waiting = grant.health.next_attempt_at
    if waiting is not None and waiting > now:
        return f"{grant.health.failures} refresh failures in a row; next try after {_time(waiting)}"
    return grant.renewal_note()
