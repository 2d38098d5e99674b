"""A grant given again for a provider account that already has one: what carries over, and healing.

The new authorization updates the same grant (one row per user, provider and account). A token answer without a
refresh token keeps the one the grant held while it was active (providers such as Google send a refresh token only
at the first consent); a grant that needed the user again is active once more: `grant.recovered` is audited and
logged in the completion's transaction, for `/v1/events`, webhooks and the embedded API.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from .accounts import label_for
from .events import GrantEvent, GrantEventKind
from .handles import grant_aad
from .ports import Store, Tx, Vault
from .records import GrantRecord, TokenSet


@dataclass(frozen=True, slots=True)
class Given:
    """A grant the user gave, as stored: the record, whether it can be refreshed, the grant events it logged."""

    stored: GrantRecord
    refreshable: bool
    logged: list[GrantEvent]


async def store_given(
    store: Store,
    vault: Vault,
    grant: GrantRecord,
    tokens: TokenSet,
    *,
    held: bool,
    now: datetime,
    conn: Tx,
    label: str | None = None,
) -> Given:
    """Store `grant` (sealing `tokens`) in the caller's transaction. When its user held no grant at the provider a
    moment ago (`held` False) it is inserted in one statement, unless its account has one by now; otherwise the
    user's grants there are read here, in the transaction, and the account's earlier grant replaced: its refresh
    token carried over, its recovery audited and logged, its label kept unless the user gave one (`label`), and the
    label made unique among the user's accounts (`accounts.label_for`)."""
    stored = None if held else await store.grants.insert_new(grant, conn=conn)
    if stored is not None:
        return Given(stored, tokens.refresh_token is not None, [])
    grants = await store.grants.find(grant.identity, grant.provider, conn, tenants=(grant.tenant,))
    previous = next((g for g in grants if g.provider_account_id == grant.provider_account_id), None)
    named = label_for(label, previous, grant.account_name, grant.provider_account_id, grants)
    grant = replace(grant, account_label=named)
    carried = carried_over(tokens, previous, vault)
    if carried is not tokens:
        aad = grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)
        key_id, blob = vault.encrypt_json(carried.to_json(), aad=aad)
        grant = replace(grant, token_key_id=key_id, token_ciphertext=blob)
    stored = await store.grants.upsert(grant, conn=conn)
    logged = await record_recovery(store, previous, stored, now=now, conn=conn)
    return Given(stored, carried.refresh_token is not None, logged)


def carried_over(tokens: TokenSet, previous: GrantRecord | None, vault: Vault) -> TokenSet:
    """`tokens` with the previous grant's refresh token when the new answer has none and that grant was active."""
    if tokens.refresh_token is not None or previous is None or previous.health.needs_user:
        return tokens
    aad = grant_aad(
        previous.identity.issuer, previous.identity.subject, previous.provider, previous.provider_account_id
    )
    held = TokenSet.from_json(vault.decrypt_json(previous.token_key_id, previous.token_ciphertext, aad=aad))
    return tokens if held.refresh_token is None else replace(tokens, refresh_token=held.refresh_token)


async def record_recovery(
    store: Store, previous: GrantRecord | None, stored: GrantRecord, *, now: datetime, conn: Tx
) -> list[GrantEvent]:
    """When `previous` needed the user: audit and log `grant.recovered` in the caller's transaction; the logged
    event (to publish after the commit), or nothing."""
    if previous is None or not previous.health.needs_user:
        return []
    await store.audit.record(
        "grant_recovered",
        identity=stored.identity,
        provider=stored.provider,
        detail={"grant_id": stored.id, "reason": previous.health.reason},
        now=now,
        conn=conn,
    )
    event = GrantEvent(
        GrantEventKind.RECOVERED,
        stored.id,
        stored.identity,
        stored.provider,
        stored.provider_account_id,
        reason=previous.health.reason,
        tenant=stored.tenant,
    )
    return await store.outbox.append([event], at=now, conn=conn)
