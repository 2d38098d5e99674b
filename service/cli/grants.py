"""`acp-connector grants list|revoke|migrate`: users' grants as stored (metadata only: never a token), revoking one
as the console does (audited with the CLI's operator), and migrating legacy grants (`service.tokens.migration`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from ..core.paging import Page, Position
from .framework import CliError, Commands, Invocation, UsageError

if TYPE_CHECKING:
    from ..core.records import GrantRecord
    from ..providers import ProviderCatalog
    from ..store import Store

T = TypeVar("T")

LIMIT = 1000
MIGRATE_BATCH = 100


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
    migrate = grants.command(
        "migrate",
        run_migrate,
        help="migrate legacy grants (non-expiring tokens) to expiring tokens, ahead of the provider's deadline",
        description=(
            "Every grant that holds a non-expiring token and no refresh token, at a provider whose catalog entry\n"
            "says how to migrate it (legacy_token_exchange: Shopify, whose non-expiring tokens stop working on\n"
            "2027-01-01), is exchanged for an expiring token and a refresh token, with no user. A grant is also\n"
            "migrated at its next use; this covers the grants nobody uses before the deadline. Grants are read\n"
            "--batch-size at a time. Safe while replicas serve: each grant goes through the same locks as a use,\n"
            "so a grant used meanwhile is exchanged once. Safe to interrupt (even kill) and run again: it carries\n"
            "on with what is left. Exit code 1 naming a grant when some could not be migrated (the provider\n"
            "refused it: the user must connect again; or it failed for now: run again later)."
        ),
        examples=["acp-connector grants migrate", "acp-connector grants migrate --provider shopify --batch-size 50"],
    )
    migrate.add_argument("--provider", metavar="NAME", help="only this provider's grants (default: every provider)")
    migrate.add_argument(
        "--batch-size", type=int, default=MIGRATE_BATCH, metavar="N", help=f"grants read at a time ({MIGRATE_BATCH})"
    )
    migrate.add_argument(
        "--pause", type=float, default=0.0, metavar="SECONDS", help="wait between batches, to spare the provider"
    )


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


def run_migrate(invocation: Invocation) -> int:
    import asyncio

    from ..app import build_runtime
    from ..tokens.migration import MigrationReport, migrate_legacy_grants

    args = invocation.args
    if args.batch_size < 1 or args.pause < 0:
        raise UsageError("grants migrate: --batch-size must be at least 1 and --pause not negative")
    settings = invocation.settings()

    async def run() -> tuple[list[str], MigrationReport]:
        runtime = build_runtime(settings)
        try:
            await runtime.store.check_schema()
            names = _migratable(runtime.providers.catalog, args.provider)
            providers = [await runtime.providers.resolve(name) for name in names]
            report = await migrate_legacy_grants(
                runtime.store,
                runtime.tokens,
                providers,
                batch_size=args.batch_size,
                pause=args.pause,
                progress=lambda so_far: invocation.note(f"migrated {so_far.migrated} grants so far"),
            )
            await runtime.store.audit.record(
                "grants_migrated",
                detail={
                    "providers": names,
                    "migrated": report.migrated,
                    "not_legacy": report.not_legacy,
                    "needs_user": len(report.needs_user),
                    "failed": len(report.failed),
                    "unreadable": len(report.unreadable),
                },
            )
            return names, report
        finally:
            await runtime.close()

    names, report = asyncio.run(run())
    invocation.note(
        f"{report.migrated} legacy grants migrated at {', '.join(names) or 'no provider'}; "
        f"{len(report.needs_user)} need the user, {len(report.failed)} failed for now, "
        f"{len(report.unreadable)} do not decrypt"
    )
    if report.complete:
        return 0
    problems = [
        f"{len(report.needs_user)} need the user (first: {report.needs_user[0]})" if report.needs_user else "",
        f"{len(report.failed)} failed for now (first: {report.failed[0][0]}, {report.failed[0][1]})"
        if report.failed
        else "",
        f"{len(report.unreadable)} do not decrypt (first: {report.unreadable[0]})" if report.unreadable else "",
    ]
    raise CliError(
        "grants migrate: some legacy grants were not migrated: " + "; ".join(p for p in problems if p),
        "those needing the user must connect again; run again later for the others (`grants list` shows each)",
    )


def _migratable(catalog: ProviderCatalog, only: str | None) -> list[str]:
    """The configured providers whose entry migrates legacy grants (`legacy_token_exchange`), or `only`."""
    if only is not None:
        entry = catalog.get(only)  # UnknownProvider, naming the known ones
        if entry.quirks.token_request.legacy_exchange is None:
            raise UsageError(
                f"grants migrate: provider {only!r} has no legacy_token_exchange in its catalog entry",
                "only a provider that says how to migrate its non-expiring tokens can be migrated",
            )
        catalog.require_configured(only)
        return [only]
    return [
        entry.name
        for entry in catalog.entries()
        if entry.quirks.token_request.legacy_exchange is not None and entry.configured
    ]


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
