"""Grants belong to a tenant: the one through which they were made (an API key's tenant, or `embedded`, the
embedded connector's own). Only it, and tenants an operator names as sharing (`[tenants] shared_groups`), see,
use and revoke them.

Existing grants are assigned, each by the first rule that answers:
1. the tenant of the elicitation that stored it: the audit trail's `completed` (or `completed_after_cancel`) event
   names the grant and the elicitation, whose connection key (the elicitation's row, else its entry in the event
   log) names a `/v1` tenant, or none (the embedded connector);
2. when the deployment has API keys of exactly one tenant: that tenant (a sidecar serving one agent, whose old
   elicitations retention has removed, keeps its users' grants);
3. else `embedded` (the embedded connector's own). An operator who wants an agent to keep using such grants names
   the two in `[tenants] shared_groups` (e.g. `embedded+billing-bot`), or the user authorizes again.

A contract step: the grant's unique key gains the tenant (one grant per tenant, user, provider and account), so a
replica of the previous release (whose upsert names the old key) cannot store grants on this schema. It declares
this revision as the oldest code that runs on it: previous-release replicas go unready (schema_not_current) when it
runs. Upgrade every replica, then migrate.

Revision ID: 0015
Revises: 0017
Create Date: 2026-12-04
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
oldest_code_revision = "0015"

EMBEDDED_TENANT = "embedded"  # service.core.tenants.EMBEDDED_TENANT, as it was when this was written
COMPLETION_EVENTS = ("completed", "completed_after_cancel")


def _tenant_of_key(connection_key: str) -> str:
    if connection_key.startswith("v1:"):
        return connection_key[3:].partition(":")[0]
    return EMBEDDED_TENANT


def _assignments(conn: sa.Connection) -> dict[str, str]:
    """The tenant of each existing grant, by the rules above."""
    grant_ids = [row[0] for row in conn.execute(sa.text("SELECT id FROM grants"))]
    if not grant_ids:
        return {}
    made_by: dict[str, str] = {}  # grant id -> the elicitation that stored it last
    audit = conn.execute(
        sa.text(
            "SELECT elicitation_id, detail FROM audit_events WHERE event IN ('completed', 'completed_after_cancel') "
            "AND elicitation_id IS NOT NULL ORDER BY id"
        )
    )
    for elicitation_id, detail in audit:
        try:
            grant_id = json.loads(detail or "{}").get("grant_id")
        except ValueError:
            continue
        if isinstance(grant_id, str):
            made_by[grant_id] = elicitation_id
    keys: dict[str, str] = {}
    for elicitation_id, key in conn.execute(sa.text("SELECT elicitation_id, connection_key FROM elicitation_events")):
        keys.setdefault(elicitation_id, key)
    for elicitation_id, key in conn.execute(sa.text("SELECT id, connection_key FROM elicitations")):
        keys[elicitation_id] = key
    api_tenants = [row[0] for row in conn.execute(sa.text("SELECT DISTINCT tenant FROM api_keys"))]
    fallback = api_tenants[0] if len(api_tenants) == 1 else EMBEDDED_TENANT
    assigned: dict[str, str] = {}
    for grant_id in grant_ids:
        key = keys.get(made_by.get(grant_id, ""))
        assigned[grant_id] = _tenant_of_key(key) if key is not None else fallback
    return assigned


def upgrade() -> None:
    op.add_column("grants", sa.Column("tenant", sa.String(64), nullable=True))
    if context.is_offline_mode():
        # SQL for a DBA to run (`--sql`): rules 2 and 3 only (rule 1 reads the audit trail's JSON, row by row).
        op.execute(
            "UPDATE grants SET tenant = COALESCE((SELECT MIN(tenant) FROM api_keys HAVING COUNT(DISTINCT tenant) = 1), "
            "'embedded')"  # EMBEDDED_TENANT
        )
    else:
        conn = op.get_bind()
        update = sa.text("UPDATE grants SET tenant = :tenant WHERE id = :id")
        assigned = _assignments(conn)
        if assigned:
            conn.execute(update, [{"id": grant_id, "tenant": tenant} for grant_id, tenant in assigned.items()])
    with op.batch_alter_table("grants") as batch:
        batch.alter_column("tenant", existing_type=sa.String(64), nullable=False)
        batch.drop_constraint("uq_grants_account", type_="unique")
        batch.create_unique_constraint(
            "uq_grants_tenant_account",
            ["identity_issuer", "identity_subject", "provider", "tenant", "provider_account_id"],
        )
    # A tenant's grants, newest first (0017 made the overall order's index, ix_grants_updated_at_id).
    op.create_index("ix_grants_tenant_updated", "grants", ["tenant", "updated_at", "id"])


def downgrade() -> None:
    # Grants of one account held by several tenants cannot share the old key: the newest of each is kept.
    op.drop_index("ix_grants_tenant_updated", "grants")
    if not context.is_offline_mode():
        _keep_the_newest_per_account(op.get_bind())
    with op.batch_alter_table("grants") as batch:
        batch.drop_constraint("uq_grants_tenant_account", type_="unique")
        batch.create_unique_constraint(
            "uq_grants_account", ["identity_issuer", "identity_subject", "provider", "provider_account_id"]
        )
        batch.drop_column("tenant")


def _keep_the_newest_per_account(conn: sa.Connection) -> None:
    rows = conn.execute(
        sa.text(
            "SELECT id, identity_issuer, identity_subject, provider, provider_account_id FROM grants "
            "ORDER BY updated_at DESC, id"
        )
    )
    seen: set[tuple[str, str, str, str]] = set()
    extra: list[str] = []
    for grant_id, *account in rows:
        key = (account[0], account[1], account[2], account[3])
        if key in seen:
            extra.append(grant_id)
        seen.add(key)
    if extra:
        conn.execute(sa.text("DELETE FROM grants WHERE id = :id"), [{"id": grant_id} for grant_id in extra])
