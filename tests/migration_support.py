"""Legacy grants for the token migration tests: a grant stored with a provider's non-expiring token and no refresh
token, as grants were before the catalog asked for expiring tokens (Shopify's before `expiring = 1`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service import Identity
from service.core.handles import grant_aad, new_id
from service.core.records import GrantRecord, TokenSet
from service.store import Store
from service.vault import Vault

SHOP = {"subdomain": "acme"}  # the shop every Shopify grant of these tests is for (the mock checks it)


async def seed_grant(
    store: Store,
    vault: Vault,
    user: Identity,
    provider: str,
    tokens: TokenSet,
    *,
    account: str | None = None,
    tenant: str = "embedded",
) -> GrantRecord:
    """Store `tokens` as `user`'s grant at `provider` (account `account`, default a new one)."""
    account = account or f"shop-{new_id(6)}"
    aad = grant_aad(user.issuer, user.subject, provider, account)
    key_id, blob = vault.encrypt_json(tokens.to_json(), aad=aad)
    now = datetime.now(UTC)
    expires = None if tokens.expires_at is None else datetime.fromtimestamp(tokens.expires_at, UTC)
    record = GrantRecord(
        id=new_id(16),
        identity=user,
        provider=provider,
        provider_account_id=account,
        scopes=tokens.scopes or (),
        token_key_id=key_id,
        token_ciphertext=blob,
        token_expires_at=expires,
        created_at=now,
        updated_at=now,
        tenant=tenant,
    )
    return await store.grants.upsert(record)


def legacy_tokens(access_token: str, connection: dict[str, str] | None = None) -> TokenSet:
    """A legacy grant's set: a non-expiring access token, no refresh token."""
    return TokenSet(
        access_token=access_token,
        token_type="bearer",
        refresh_token=None,
        expires_at=None,
        scopes=("read_products",),
        issued_at=datetime.now(UTC).timestamp(),
        connection=dict(SHOP if connection is None else connection),
    )


def stored_set(store_grant: GrantRecord, vault: Vault) -> dict[str, Any]:
    g = store_grant
    aad = grant_aad(g.identity.issuer, g.identity.subject, g.provider, g.provider_account_id)
    return vault.decrypt_json(g.token_key_id, g.token_ciphertext, aad=aad)  # type: ignore[no-any-return]
