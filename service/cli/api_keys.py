"""`acp-connector api-keys ...`: keys of the `/v1` API, each bound to a tenant (an agent) and stored hashed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .framework import CliError, Commands, Invocation, UsageError

if TYPE_CHECKING:
    from ..store import Store


def register(commands: Commands) -> None:
    keys = commands.group(
        "api-keys",
        help="keys of the /v1 API for agents (stored hashed)",
        description=(
            "Keys an agent presents to the /v1 API (Authorization: Bearer). Each is bound to a tenant (the\n"
            "agent: its elicitations and events are its own), the agent name the consent page shows, and an\n"
            "optional list of providers it may use. Only a hash of each key is stored."
        ),
    )
    create = keys.command(
        "create",
        run_create,
        help="create a key and print it (shown only this once)",
        description=(
            "Create a key for a tenant and print it on stdout. It is not stored and cannot be shown again:\n"
            "hand it to the agent (e.g. as a secret environment variable)."
        ),
        examples=[
            "acp-connector api-keys create --tenant billing-bot --agent-name 'Billing Bot' --provider github",
        ],
    )
    create.add_argument("--tenant", required=True, help="the agent the key speaks for (a-z, 0-9, '.', '_', '-')")
    create.add_argument("--agent-name", help="who the consent page says asks (default: the tenant)")
    create.add_argument(
        "--provider",
        action="append",
        dest="providers",
        metavar="NAME",
        help="a provider it may use (repeat; default: all)",
    )
    keys.command(
        "list",
        run_list,
        help="list keys (never the keys themselves)",
        description="One line per key: its id, tenant, agent name, providers (* for all), when created and revoked.",
        examples=["acp-connector api-keys list"],
    )
    revoke = keys.command(
        "revoke",
        run_revoke,
        help="revoke a key by its id",
        description="Revoke a key: from then on it is refused (401). Its elicitations and grants stay.",
        examples=["acp-connector api-keys revoke ak_Xb3...."],
    )
    revoke.add_argument("key_id", help="the key's id (ak_...), as `api-keys list` shows it")


def run_create(invocation: Invocation) -> int:
    from ..core.agent_api import new_api_key

    args = invocation.args
    try:
        key, record = new_api_key(args.tenant, args.agent_name or args.tenant, args.providers, datetime.now(UTC))
    except ValueError as exc:
        raise UsageError(f"api-keys create: {exc}") from None

    async def store_it(store: Store) -> None:
        await store.api_keys.insert(record)
        detail = {"key_id": record.id, "tenant": record.tenant}
        await store.audit.record("api_key_created", detail=detail, now=record.created_at)

    invocation.with_store(store_it)
    invocation.out(key)
    invocation.note(f"created {record.id} for tenant {record.tenant}; the key above is not stored anywhere")
    return 0


def run_list(invocation: Invocation) -> int:
    listed = invocation.with_store(lambda store: store.api_keys.list())
    rows = [("ID", "TENANT", "AGENT NAME", "PROVIDERS", "CREATED", "REVOKED")]
    for item in listed:
        rows.append(
            (
                item.id,
                item.tenant,
                item.agent_name,
                ",".join(item.providers) if item.providers is not None else "*",
                item.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                item.revoked_at.strftime("%Y-%m-%dT%H:%M:%SZ") if item.revoked_at else "-",
            )
        )
    invocation.table(rows)
    return 0


def run_revoke(invocation: Invocation) -> int:
    key_id = invocation.args.key_id
    now = datetime.now(UTC)

    async def revoke(store: Store) -> bool:
        if not await store.api_keys.revoke(key_id, now):
            return False
        await store.audit.record("api_key_revoked", detail={"key_id": key_id}, now=now)
        return True

    if not invocation.with_store(revoke):
        raise CliError(f"api-keys revoke: no live key with id {key_id}", "see `acp-connector api-keys list`")
    invocation.note(f"revoked {key_id}")
    return 0
