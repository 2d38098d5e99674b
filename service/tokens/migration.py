"""Migrating every legacy grant ahead of its provider's deadline (`acp-connector grants migrate`).

A legacy grant holds a non-expiring access token and no refresh token, at a provider whose catalog entry says how
to migrate it (`legacy_token_exchange`: Shopify invalidates such tokens on 2027-01-01). A grant is migrated at its
next use anyway; this covers the grants nobody uses before the deadline. Grants are read in pages of `batch_size`
by id; each eligible one is migrated through `TokenAccess.migrate`, under the same per-grant locks as a use (the
process's own, and the database's across replicas and processes), so a grant used on a replica meanwhile is
exchanged once. A migrated grant has an expiry from then on and is not read again: a new run (after a crash, or a
kill) carries on with what is left, and a grant whose exchange was lost is retried with the same old token (Shopify
answers the same pair for seven days).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from service.core.errors import ConnectorError, GrantNeedsUser, NotAuthorized, VaultError
from service.oauth import ResolvedProvider
from service.oauth.token import is_legacy
from service.store import Store

from .access import TokenAccess


@dataclass
class MigrationReport:
    migrated: int = 0  # legacy grants whose set is now a migrated one (by this run, or a use meanwhile)
    not_legacy: int = 0  # looked at, but holding a refresh token or an expiry already: nothing to do
    needs_user: list[str] = field(default_factory=list)  # ids of grants the provider refused (or refused before)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (id, error code) of failures for now
    unreadable: list[str] = field(default_factory=list)  # ids of grants that do not decrypt with this ring

    @property
    def complete(self) -> bool:
        return not (self.needs_user or self.failed or self.unreadable)


async def migrate_legacy_grants(
    store: Store,
    tokens: TokenAccess,
    providers: Sequence[ResolvedProvider],
    *,
    batch_size: int,
    pause: float = 0.0,
    progress: Callable[[MigrationReport], None] | None = None,
) -> MigrationReport:
    """Migrate every legacy grant at `providers` (each declares `legacy_token_exchange`), `batch_size` grants read
    at a time, sleeping `pause` seconds between batches."""
    by_name = {provider.name: provider for provider in providers}
    report, after = MigrationReport(), ""
    while by_name:
        batch = await store.grants.without_expiry(by_name, after=after, limit=batch_size)
        if not batch:
            break
        after = batch[-1].id
        for grant in batch:
            provider = by_name[grant.provider]
            if grant.health.needs_user:
                report.needs_user.append(grant.id)
                continue
            try:
                legacy = is_legacy(provider, tokens.decrypt(grant))
            except VaultError:
                report.unreadable.append(grant.id)
                continue
            if not legacy:
                report.not_legacy += 1
                continue
            await _migrate_one(tokens, grant.id, provider, report)
        if progress is not None:
            progress(report)
        if pause:
            await asyncio.sleep(pause)
    return report


async def _migrate_one(tokens: TokenAccess, grant_id: str, provider: ResolvedProvider, report: MigrationReport) -> None:
    try:
        await tokens.migrate(grant_id, provider)
    except GrantNeedsUser:
        report.needs_user.append(grant_id)
    except NotAuthorized:
        return  # disconnected meanwhile: nothing to migrate
    except ConnectorError as exc:  # a transient failure (backing off), a refusal, another replica's long refresh
        report.failed.append((grant_id, exc.code))
    else:
        report.migrated += 1
