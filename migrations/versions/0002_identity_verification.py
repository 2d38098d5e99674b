"""Identity verification: server-side verifier state, and the mismatch count per elicitation.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ALTER TABLE (no table copy on SQLite, where copying would cascade-delete the flows).
    op.add_column("elicitations", sa.Column("identity_mismatches", sa.Integer(), nullable=False, server_default="0"))

    op.create_table(
        "identity_verifications",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("elicitation_id", sa.String(64), nullable=False),
        sa.Column("verifier", sa.String(32), nullable=False),
        sa.Column("handle_hash", sa.String(128), nullable=False),
        sa.Column("return_hash", sa.String(128), nullable=True),
        sa.Column("browser_binding_hash", sa.String(128), nullable=False),
        sa.Column("nonce", sa.String(255), nullable=True),
        sa.Column("pkce_key_id", sa.String(64), nullable=True),
        sa.Column("pkce_ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("identity_issuer", sa.String(512), nullable=True),
        sa.Column("identity_subject", sa.String(512), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("confirmed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_identity_verifications"),
        sa.ForeignKeyConstraint(
            ["elicitation_id"],
            ["elicitations.id"],
            name="fk_identity_verifications_elicitation_id_elicitations",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("handle_hash", name="uq_identity_verifications_handle_hash"),
        sa.UniqueConstraint("return_hash", name="uq_identity_verifications_return_hash"),
    )
    op.create_index("ix_identity_verifications_elicitation_id", "identity_verifications", ["elicitation_id"])


def downgrade() -> None:
    op.drop_index("ix_identity_verifications_elicitation_id", table_name="identity_verifications")
    op.drop_table("identity_verifications")
    op.drop_column("elicitations", "identity_mismatches")  # native DROP COLUMN (SQLite 3.35+)
