"""`acp-connector webhooks ...`: signed-webhook endpoints of `/v1` tenants (the same as `POST /v1/webhooks`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from ..core.settings import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from .framework import CliError, Commands, Invocation, UsageError

if TYPE_CHECKING:
    from ..config import Settings
    from ..core.webhooks import WebhookEndpoints
    from ..store import Store

T = TypeVar("T")


def register(commands: Commands) -> None:
    hooks = commands.group(
        "webhooks",
        help="signed webhook endpoints of /v1 tenants",
        description=(
            "Endpoints to which a tenant's events (the /v1/events stream) are POSTed as Standard Webhooks,\n"
            "signed with HMAC-SHA256 (webhook-id, webhook-timestamp, webhook-signature: v1,<base64>). Each\n"
            "endpoint has its own secret, printed once when it is created and stored only encrypted by the vault."
        ),
    )
    create = hooks.command(
        "create",
        run_create,
        help="register an endpoint and print its secret (shown only this once)",
        description=(
            "Register an https endpoint for a tenant and print its signing secret on stdout. Events logged from\n"
            "now on are delivered to it (at least once; deduplicate on webhook-id)."
        ),
        examples=["acp-connector webhooks create --tenant billing-bot --url https://bot.example.com/hooks/acp"],
    )
    create.add_argument("--tenant", required=True, help="the tenant (as `api-keys create --tenant` named it)")
    create.add_argument("--url", required=True, help="where to POST (https; a public address)")
    create.add_argument("--description", help="a note for people")
    listing = hooks.command(
        "list",
        run_list,
        help="list endpoints (never their secrets)",
        description="One line per endpoint: its id, tenant, URL and when it was created.",
        examples=["acp-connector webhooks list --tenant billing-bot"],
    )
    listing.add_argument("--tenant", help="only this tenant's")
    delete = hooks.command(
        "delete",
        run_delete,
        help="remove an endpoint by its id",
        description="Remove an endpoint with its deliveries: nothing more is sent to it.",
        examples=["acp-connector webhooks delete wh_Xb3...."],
    )
    delete.add_argument("webhook_id", help="the endpoint's id (wh_...), as `webhooks list` shows it")
    rotate = hooks.command(
        "rotate-secret",
        run_rotate_secret,
        help="give an endpoint a new secret and print it (the old one keeps signing for the overlap)",
        description=(
            "Print a new signing secret for the endpoint (shown only this once). Until the overlap ends each\n"
            "delivery carries two signatures, webhook-signature: v1,<new> v1,<old>, so its receiver verifies with\n"
            "either secret and switches when it likes; after it, only the new secret signs. A previous secret\n"
            "still in its overlap is dropped (one previous secret is kept)."
        ),
        examples=["acp-connector webhooks rotate-secret wh_Xb3.... --overlap-seconds 3600"],
    )
    rotate.add_argument("webhook_id", help="the endpoint's id (wh_...), as `webhooks list` shows it")
    rotate.add_argument(
        "--overlap-seconds",
        type=int,
        default=int(DEFAULT_SECRET_OVERLAP.total_seconds()),
        help=f"how long the old secret keeps signing (0 to {int(MAX_SECRET_OVERLAP.total_seconds())}; default: "
        f"{int(DEFAULT_SECRET_OVERLAP.total_seconds())})",
    )


def _with_endpoints(settings: Settings, work: Callable[[Store, WebhookEndpoints], Awaitable[T]]) -> T:
    import asyncio

    from ..core.webhooks import WebhookEndpoints
    from ..store import Store
    from .keys import _vault

    vault = _vault(settings)

    async def run() -> T:
        store = Store.from_url(settings.database.url)
        try:
            await store.check_schema()
            endpoints = WebhookEndpoints(
                store.webhooks, store.outbox, vault, settings.webhooks.policy(), lambda: datetime.now(UTC)
            )
            return await work(store, endpoints)
        finally:
            await store.close()

    return asyncio.run(run())


def run_create(invocation: Invocation) -> int:
    args = invocation.args

    async def create(store: Store, endpoints: WebhookEndpoints) -> tuple[str, str]:
        try:
            record, secret = await endpoints.create(args.tenant, args.url, args.description)
        except ValueError as exc:
            raise UsageError(f"webhooks create: {exc}") from None
        except LookupError as exc:
            raise CliError(f"webhooks create: {exc}", "remove one with `acp-connector webhooks delete`") from None
        detail = {"webhook_id": record.id, "tenant": record.tenant, "via": "cli"}
        await store.audit.record("webhook_created", detail=detail, now=record.created_at)
        return record.id, secret

    webhook_id, secret = _with_endpoints(invocation.settings(), create)
    invocation.out(secret)
    invocation.note(f"created {webhook_id} for tenant {args.tenant}; the secret above is not shown again")
    return 0


def run_list(invocation: Invocation) -> int:
    tenant = invocation.args.tenant
    listed = _with_endpoints(invocation.settings(), lambda store, endpoints: endpoints.repo.endpoints(tenant))
    rows = [("ID", "TENANT", "URL", "CREATED")]
    for item in listed:
        rows.append((item.id, item.tenant, item.url, item.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")))
    invocation.table(rows)
    return 0


def run_delete(invocation: Invocation) -> int:
    webhook_id = invocation.args.webhook_id

    async def delete(store: Store, endpoints: WebhookEndpoints) -> bool:
        found = await endpoints.repo.endpoint(webhook_id)
        if found is None or not await endpoints.repo.delete_endpoint(webhook_id):
            return False
        detail = {"webhook_id": webhook_id, "tenant": found.tenant, "via": "cli"}
        await store.audit.record("webhook_deleted", detail=detail, now=datetime.now(UTC))
        return True

    if not _with_endpoints(invocation.settings(), delete):
        raise CliError(f"webhooks delete: no endpoint with id {webhook_id}", "see `acp-connector webhooks list`")
    invocation.note(f"deleted {webhook_id}")
    return 0


def run_rotate_secret(invocation: Invocation) -> int:
    args = invocation.args
    overlap = args.overlap_seconds
    if not 0 <= overlap <= MAX_SECRET_OVERLAP.total_seconds():
        raise UsageError(f"webhooks rotate-secret: --overlap-seconds is 0 to {int(MAX_SECRET_OVERLAP.total_seconds())}")

    async def rotate(store: Store, endpoints: WebhookEndpoints) -> tuple[str, datetime | None] | None:
        found = await endpoints.repo.endpoint(args.webhook_id)
        if found is None:
            return None
        try:
            record, secret = await endpoints.rotate_secret(found, timedelta(seconds=overlap))
        except LookupError:
            return None
        detail = {"webhook_id": record.id, "tenant": record.tenant, "via": "cli", "overlap_seconds": overlap}
        await store.audit.record("webhook_secret_rotated", detail=detail, now=datetime.now(UTC))
        return secret, record.previous_secret_expires_at

    rotated = _with_endpoints(invocation.settings(), rotate)
    if rotated is None:
        raise CliError(
            f"webhooks rotate-secret: no endpoint with id {args.webhook_id}", "see `acp-connector webhooks list`"
        )
    secret, until = rotated
    invocation.out(secret)
    previous = (
        f"the previous secret signs too until {until.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        if until is not None
        else "the previous secret no longer signs"
    )
    invocation.note(f"rotated the secret of {args.webhook_id}; {previous}; the secret above is not shown again")
    return 0
