"""Vault key rotation over the store: what each key encrypts, re-encrypting every grant under the primary key, and
whether a key may be retired.

`rotate_grants` works in batches, each its own transaction, so a crash loses at most the batch in flight and a new
run carries on where the last one stopped (it picks the grants not yet under the primary key). Each row is
swapped only if it still holds what was read (`GrantRepository.swap_ciphertext`): a replica that refreshes a
grant meanwhile keeps its new tokens, and the grant is picked up again on the next pass. The tokens themselves
never change, nor does the grant's `updated_at`; the associated data binding the ciphertext to its row stays.

Safe while other replicas serve, provided every replica already has the primary key in its ring (the README's
runbook): a replica that lacks it could not read a grant rotated under it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from .core.errors import VaultError
from .core.handles import grant_aad
from .core.records import GrantRecord
from .store import Store
from .vault import Vault

MAX_PASSES = 10  # a grant another replica keeps rewriting under an old key is left for a later run


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """What one key id still encrypts: grants, webhook endpoint secrets, and secrets of flows still in progress (at
    most minutes old)."""

    grants: int = 0
    open_flows: int = 0
    open_verifications: int = 0
    webhook_secrets: int = 0

    @property
    def in_use(self) -> bool:
        return bool(self.grants or self.open_flows or self.open_verifications or self.webhook_secrets)


async def key_usage(store: Store, now: datetime) -> dict[str, KeyUsage]:
    """Every key id the store uses (configured or not), with what it encrypts."""
    grants = await store.grants.count_by_key()
    flows = await store.flows.open_by_key(now)
    verifications = await store.verifications.open_by_key(now)
    webhooks = await store.webhooks.count_by_key()
    return {
        key_id: KeyUsage(
            grants.get(key_id, 0), flows.get(key_id, 0), verifications.get(key_id, 0), webhooks.get(key_id, 0)
        )
        for key_id in sorted({*grants, *flows, *verifications, *webhooks})
    }


@dataclass
class RotationReport:
    rotated: int = 0
    changed_meanwhile: int = 0  # refreshed on another replica while read: picked up on the next pass
    unreadable: list[str] = field(default_factory=list)  # grant ids that do not decrypt with this ring

    @property
    def complete(self) -> bool:
        return not self.unreadable


def aad_of(grant: GrantRecord) -> bytes:
    return grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)


async def rotate_grants(
    store: Store,
    vault: Vault,
    *,
    batch_size: int,
    pause: float = 0.0,
    progress: Callable[[RotationReport], None] | None = None,
) -> RotationReport:
    """Re-encrypt every grant that is not under the primary key, `batch_size` per transaction, sleeping `pause`
    seconds between batches (to spare a busy database). Passes repeat until a pass finds nothing it can do."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    primary = vault.primary_key_id
    report = RotationReport()
    for _ in range(MAX_PASSES):
        changed_before = report.changed_meanwhile
        after = ""
        while True:
            batch = await store.grants.not_under(primary, after=after, limit=batch_size)
            if not batch:
                break
            after = batch[-1].id
            # Decrypt and encrypt before the write transaction opens: it lasts only as long as the swaps.
            swaps = []
            for grant in batch:
                try:
                    swaps.append(
                        (grant, *vault.reencrypt(grant.token_key_id, grant.token_ciphertext, aad=aad_of(grant)))
                    )
                except VaultError:
                    if grant.id not in report.unreadable:
                        report.unreadable.append(grant.id)
            async with store.transaction() as tx:
                for grant, key_id, blob in swaps:
                    swapped = await store.grants.swap_ciphertext(
                        grant.id,
                        old_key_id=grant.token_key_id,
                        old_ciphertext=grant.token_ciphertext,
                        new_key_id=key_id,
                        new_ciphertext=blob,
                        conn=tx,
                    )
                    if swapped:
                        report.rotated += 1
                    else:
                        report.changed_meanwhile += 1
            if progress is not None:
                progress(report)
            if pause > 0:
                await asyncio.sleep(pause)
        if report.changed_meanwhile == changed_before:
            break  # nothing moved under us in this pass: what is left is unreadable
    return report
