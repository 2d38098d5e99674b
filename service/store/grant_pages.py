"""The grants listing's query: filters, and keyset paging in the listing's order (newest change first, then id)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Select, and_, or_, select

from .tables import grants


def listing(
    *,
    subject: str | None,
    issuer: str | None,
    provider: str | None,
    tenants: Collection[str] | None,
    after: tuple[datetime, str] | None,
    limit: int,
) -> Select[tuple[object, ...]]:
    """Grants matching what is given, `updated_at` descending then `id`, at most `limit`, starting after the row
    `after` names (`(updated_at, id)` of the previous page's last row): each page costs the same at any depth (the
    indexes `ix_grants_updated_at_id` (0017) and `ix_grants_tenant_updated` (0015) serve it)."""
    statement = select(grants).order_by(grants.c.updated_at.desc(), grants.c.id).limit(limit)
    if subject is not None:
        statement = statement.where(grants.c.identity_subject == subject)
    if issuer is not None:
        statement = statement.where(grants.c.identity_issuer == issuer)
    if provider is not None:
        statement = statement.where(grants.c.provider == provider)
    if tenants is not None:
        statement = statement.where(grants.c.tenant.in_(sorted(tenants)))
    if after is not None:
        at, last_id = after
        statement = statement.where(
            or_(grants.c.updated_at < at, and_(grants.c.updated_at == at, grants.c.id > last_id))
        )
    return statement
