"""Initial schema: elicitations, oauth_flows, grants, audit_events.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "elicitations",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("connection_key", sa.String(255), nullable=False),
        sa.Column("identity_issuer", sa.String(512), nullable=False),
        sa.Column("identity_subject", sa.String(512), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=True),
        sa.Column("tool_call_id", sa.String(255), nullable=True),
        sa.Column("request_id", sa.Text(), nullable=True),
        sa.Column("agent_name", sa.String(255), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_elicitations"),
    )
    op.create_index("ix_elicitations_status_expires_at", "elicitations", ["status", "expires_at"])
    op.create_index("ix_elicitations_connection_key", "elicitations", ["connection_key"])

    op.create_table(
        "oauth_flows",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("elicitation_id", sa.String(64), nullable=False),
        sa.Column("state_hash", sa.String(128), nullable=False),
        sa.Column("verifier_key_id", sa.String(64), nullable=True),
        sa.Column("verifier_ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("nonce", sa.String(255), nullable=True),
        sa.Column("expected_issuer", sa.String(512), nullable=True),
        sa.Column("browser_binding_hash", sa.String(128), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_oauth_flows"),
        sa.ForeignKeyConstraint(
            ["elicitation_id"],
            ["elicitations.id"],
            name="fk_oauth_flows_elicitation_id_elicitations",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("state_hash", name="uq_oauth_flows_state_hash"),
    )
    op.create_index("ix_oauth_flows_elicitation_id", "oauth_flows", ["elicitation_id"])

    op.create_table(
        "grants",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("identity_issuer", sa.String(512), nullable=False),
        sa.Column("identity_subject", sa.String(512), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("provider_account_id", sa.String(255), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("token_key_id", sa.String(64), nullable=False),
        sa.Column("token_ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("token_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_grants"),
        sa.UniqueConstraint(
            "identity_issuer", "identity_subject", "provider", "provider_account_id", name="uq_grants_account"
        ),
    )

    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("elicitation_id", sa.String(64), nullable=True),
        sa.Column("identity_issuer", sa.String(512), nullable=True),
        sa.Column("identity_subject", sa.String(512), nullable=True),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_events"),
    )
    op.create_index("ix_audit_events_elicitation_id", "audit_events", ["elicitation_id"])
    op.create_index("ix_audit_events_event", "audit_events", ["event"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_event", table_name="audit_events")
    op.drop_index("ix_audit_events_elicitation_id", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_table("grants")
    op.drop_index("ix_oauth_flows_elicitation_id", table_name="oauth_flows")
    op.drop_table("oauth_flows")
    op.drop_index("ix_elicitations_connection_key", table_name="elicitations")
    op.drop_index("ix_elicitations_status_expires_at", table_name="elicitations")
    op.drop_table("elicitations")
