"""Vault key rotation over the store: what each key encrypts, re-encrypting every grant and every webhook endpoint
secret (the current one and, after a secret rotation, the previous one) under the primary key, and whether a key may
be retired.

`rotate_grants` and `rotate_webhook_secrets` work in batches, each its own transaction, so a crash loses at most the
batch in flight and a new run carries on where the last one stopped (it picks the rows not yet under the primary
key). Each row is swapped only if it still holds what was read (`GrantRepository.swap_ciphertext`,
`WebhookRepository.swap_secret`): a replica that refreshes a grant meanwhile keeps its new tokens, and the row is
picked up again on the next pass. What is encrypted never changes, nor does the grant's `updated_at`; the
associated data binding the ciphertext to its row (a grant's identity, an endpoint's id and tenant) stays.

Safe while other replicas serve, provided every replica already has the primary key in its ring (the README's
runbook): a replica that lacks it could not read a grant or sign a webhook rotated under it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from .core.errors import VaultError
from .core.handles import grant_aad, webhook_secret_aad
from .core.ports import Tx
from .core.records import GrantRecord
from .store import Store
from .vault import Vault

MAX_PASSES = 10  # a row another replica keeps rewriting under an old key is left for a later run


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """What one key id still encrypts: grants, webhook endpoint secrets (current and previous ones), and secrets of
    flows still in progress (at most minutes old)."""

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
    changed_meanwhile: int = 0  # rewritten on another replica while read: picked up on the next pass
    unreadable: list[str] = field(default_factory=list)  # ids of rows that do not decrypt with this ring

    @property
    def complete(self) -> bool:
        return not self.unreadable


@dataclass(frozen=True, slots=True)
class Sealed:
    """One encrypted value of a row: the row's id, the key id and ciphertext read, and the associated data."""

    id: str
    key_id: str
    ciphertext: bytes
    aad: bytes


# Up to `limit` rows not under `key_id`, ids after `after`, in id order.
Pick = Callable[[str, str, int], Awaitable[list[Sealed]]]
# Replace one row's ciphertext if it still holds what was read (conditional update); whether it did.
Swap = Callable[[Sealed, str, bytes, Tx], Awaitable[bool]]


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

    async def pick(key_id: str, after: str, limit: int) -> list[Sealed]:
        found = await store.grants.not_under(key_id, after=after, limit=limit)
        return [Sealed(g.id, g.token_key_id, g.token_ciphertext, aad_of(g)) for g in found]

    swap = _swapping(store.grants.swap_ciphertext)
    return await _rotate(store, vault, pick, swap, batch_size=batch_size, pause=pause, progress=progress)


async def rotate_webhook_secrets(
    store: Store,
    vault: Vault,
    *,
    batch_size: int,
    pause: float = 0.0,
    progress: Callable[[RotationReport], None] | None = None,
) -> RotationReport:
    """Re-encrypt every webhook endpoint's signing secret that is not under the primary key, as `rotate_grants`
    does for grants, then every previous secret (one a secret rotation keeps signing for an overlap; expired or
    not, it is still encrypted under its key). The secrets themselves (what receivers verify with) do not change."""

    async def pick(key_id: str, after: str, limit: int) -> list[Sealed]:
        found = await store.webhooks.secrets_not_under(key_id, after=after, limit=limit)
        return [Sealed(e.id, e.secret_key_id, e.secret_ciphertext, webhook_secret_aad(e.id, e.tenant)) for e in found]

    async def pick_previous(key_id: str, after: str, limit: int) -> list[Sealed]:
        found = await store.webhooks.secrets_not_under(key_id, previous=True, after=after, limit=limit)
        return [
            Sealed(e.id, e.previous_secret_key_id, e.previous_secret_ciphertext, webhook_secret_aad(e.id, e.tenant))
            for e in found
            if e.previous_secret_key_id is not None and e.previous_secret_ciphertext is not None
        ]

    report = await _rotate(
        store, vault, pick, _swapping(store.webhooks.swap_secret), batch_size=batch_size, pause=pause, progress=progress
    )
    # A secret rotation meanwhile may have moved a current secret read under the old key into the previous
    # columns (as it was): this second sweep finds it there.
    return await _rotate(
        store,
        vault,
        pick_previous,
        _swapping(functools.partial(store.webhooks.swap_secret, previous=True)),
        batch_size=batch_size,
        pause=pause,
        progress=progress,
        report=report,
    )


def _swapping(replace: Callable[..., Awaitable[bool]]) -> Swap:
    """A `Swap` over a store's conditional replace of one row's ciphertext (grants and webhook secrets alike)."""

    async def swap(row: Sealed, key_id: str, blob: bytes, tx: Tx) -> bool:
        return await replace(
            row.id,
            old_key_id=row.key_id,
            old_ciphertext=row.ciphertext,
            new_key_id=key_id,
            new_ciphertext=blob,
            conn=tx,
        )

    return swap


async def _rotate(
    store: Store,
    vault: Vault,
    pick: Pick,
    swap: Swap,
    *,
    batch_size: int,
    pause: float,
    progress: Callable[[RotationReport], None] | None,
    report: RotationReport | None = None,
) -> RotationReport:
    """Run passes of `pick` and `swap`, adding to `report` (a new one without it)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    primary = vault.primary_key_id
    report = RotationReport() if report is None else report
    for _ in range(MAX_PASSES):
        changed_before = report.changed_meanwhile
        after = ""
        while True:
            batch = await pick(primary, after, batch_size)
            if not batch:
                break
            after = batch[-1].id
            # Decrypt and encrypt before the write transaction opens: it lasts only as long as the swaps.
            swaps = []
            for row in batch:
                try:
                    swaps.append((row, *vault.reencrypt(row.key_id, row.ciphertext, aad=row.aad)))
                except VaultError:
                    if row.id not in report.unreadable:
                        report.unreadable.append(row.id)
            async with store.transaction() as tx:
                for row, key_id, blob in swaps:
                    if await swap(row, key_id, blob, tx):
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
