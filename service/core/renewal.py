"""A grant given again for a provider account that already has one: what carries over, and healing.

The new authorization updates the same grant (one row per user, provider and account). A token answer without a
refresh token keeps the one the grant held while it was active (providers such as Google send a refresh token only
at the first consent); a grant that needed the user again is active once more: `grant.recovered` is audited and
logged in the completion's transaction, for `/v1/events`, webhooks and the embedded API.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from .events import GrantEvent, GrantEventKind
from .handles import grant_aad
from .identity import Identity
from .ports import Store, Tx, Vault
from .records import GrantRecord, TokenSet


@dataclass(frozen=True, slots=True)
class Given:
    """A grant the user gave, as stored: the record, whether it can be refreshed, the grant events it logged."""

    stored: GrantRecord
    refreshable: bool
    logged: list[GrantEvent]


async def store_given(
    store: Store, vault: Vault, grant: GrantRecord, tokens: TokenSet, *, held: bool, now: datetime, conn: Tx
) -> Given:
    """Store `grant` (sealing `tokens`) in the caller's transaction. When its user held no grant at the provider a
    moment ago (`held` False) it is inserted in one statement, unless its account has one by now; otherwise the
    account's earlier grant is read here, in the transaction, and replaced: its refresh token carried over, its
    recovery audited and logged."""
    stored = None if held else await store.grants.insert_new(grant, conn=conn)
    if stored is not None:
        return Given(stored, tokens.refresh_token is not None, [])
    previous = await previous_grant(
        store, grant.identity, grant.provider, grant.provider_account_id, grant.tenant, conn=conn
    )
    carried = carried_over(tokens, previous, vault)
    if carried is not tokens:
        aad = grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)
        key_id, blob = vault.encrypt_json(carried.to_json(), aad=aad)
        grant = replace(grant, token_key_id=key_id, token_ciphertext=blob)
    stored = await store.grants.upsert(grant, conn=conn)
    logged = await record_recovery(store, previous, stored, now=now, conn=conn)
    return Given(stored, carried.refresh_token is not None, logged)


async def previous_grant(
    store: Store, user: Identity, provider: str, account_id: str, tenant: str, conn: Tx = None
) -> GrantRecord | None:
    """The grant `tenant` already holds for this user, provider and account (None when a new one is given)."""
    for grant in await store.grants.find(user, provider, conn, tenants=(tenant,)):
        if grant.provider_account_id == account_id:
            return grant
    return None


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
