"""`acp-connector grants list`: users' grants as stored (metadata only: never a token)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .framework import Commands, Invocation

if TYPE_CHECKING:
    from ..core.records import GrantRecord

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
            "revoked, account_changed; expired: no_refresh_token), the last refresh that succeeded, and a note:\n"
            "when a refresh may next be tried after transient failures, or when it was stored without the refresh\n"
            "token it was asked with (offline_access): it will need the user again at that expiry."
        ),
        examples=["acp-connector grants list --user alice --provider github"],
    )
    listing.add_argument("--user", metavar="SUBJECT", help="only this user's (their subject at the identity issuer)")
    listing.add_argument("--issuer", help="only users of this identity issuer")
    listing.add_argument("--provider", metavar="NAME", help="only grants at this provider")


def run_list(invocation: Invocation) -> int:
    import asyncio

    from ..store import Store

    args = invocation.args
    settings = invocation.settings()

    async def read() -> list[GrantRecord]:
        store = Store.from_url(settings.database.url)
        try:
            await store.check_schema()
            return await store.grants.listed(subject=args.user, issuer=args.issuer, provider=args.provider, limit=LIMIT)
        finally:
            await store.close()

    found = asyncio.run(read())
    now = datetime.now(UTC)
    rows = [("ID", "ISSUER", "SUBJECT", "PROVIDER", "ACCOUNT", "SCOPES", "EXPIRES", "STATUS", "REFRESHED", "NOTE")]
    for grant in found:
        status, reason = grant.status_at(now)
        rows.append(
            (
                grant.id,
                grant.identity.issuer,
                grant.identity.subject,
                grant.provider,
                grant.provider_account_id,
                ",".join(grant.scopes) or "-",
                _time(grant.token_expires_at),
                status.value if reason is None else f"{status.value}:{reason.value}",
                _time(grant.health.last_refresh_at),
                _note(grant, now) or "-",
            )
        )
    invocation.table(rows)
    if len(found) == LIMIT:
        invocation.note(f"only the newest {LIMIT} are listed: narrow with --user, --issuer or --provider")
    return 0


def _time(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at is not None else "-"


def _note(grant: GrantRecord, now: datetime) -> str | None:
    waiting = grant.health.next_attempt_at
    if waiting is not None and waiting > now:
        return f"{grant.health.failures} refresh failures in a row; next try after {_time(waiting)}"
    return grant.renewal_note()
