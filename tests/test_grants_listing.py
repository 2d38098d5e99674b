"""Grants that will need the user again (stored without the refresh token `offline_access` asked for) are shown as
such: `acp-connector grants list` notes it with the expiry, `GET /v1/grants` says `needsUserAgain`. Never a token."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from service.cli.program import main
from service.core.handles import new_id
from service.store import Store, migrate

from .api_support import api_client, make_key
from .conftest import ALICE, BOB, Deployment
from .sidecar_support import seed_grant

ACCESS_TOKEN = "gho_listing_access_token_never_shown"
EXPIRY = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


async def seed(store: Store, vault_keys: str) -> tuple[str, str]:
    """Two grants of ALICE's: one without the refresh token it asked for (expiring at EXPIRY), one fine; and one
    of BOB's."""
    plain = await seed_grant(store, vault_keys, ALICE, "github", ACCESS_TOKEN)
    expiring = replace(
        plain,
        id=new_id(16),
        provider_account_id="acct-2",  # its ciphertext is never decrypted here
        token_expires_at=EXPIRY,
        refused_scopes=("offline_access",),
        updated_at=plain.updated_at + timedelta(seconds=1),
    )
    expiring = await store.grants.upsert(expiring)
    await seed_grant(store, vault_keys, BOB, "github", ACCESS_TOKEN)
    return plain.id, expiring.id


def run_cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), env=env, stdout=out, stderr=err), out.getvalue(), err.getvalue()


async def test_v1_grants_say_which_need_the_user_again(deployment: Deployment, connector_env: dict[str, str]) -> None:
    store = deployment.connector.runtime.store
    plain, expiring = await seed(store, connector_env["CONNECTOR_VAULT__KEYS"])
    async with api_client(deployment.base_url, await make_key(store)) as api:
        answer = await api.get("/v1/grants", params={"issuer": ALICE.issuer, "subject": ALICE.subject})
    assert answer.status_code == 200 and ACCESS_TOKEN not in answer.text
    by_id = {g["grantId"]: g for g in answer.json()["grants"]}
    assert (by_id[plain]["needsUserAgain"], by_id[expiring]["needsUserAgain"]) == (False, True)
    assert datetime.fromisoformat(by_id[expiring]["expiresAt"]) == EXPIRY


def test_grants_list_notes_the_expiry_and_filters(connector_env: dict[str, str]) -> None:
    import asyncio

    migrate(connector_env["CONNECTOR_DATABASE__URL"])

    async def seeded() -> tuple[str, str]:
        store = Store.from_url(connector_env["CONNECTOR_DATABASE__URL"])
        try:
            return await seed(store, connector_env["CONNECTOR_VAULT__KEYS"])
        finally:
            await store.close()

    plain, expiring = asyncio.run(seeded())
    code, out, _ = run_cli(connector_env, "grants", "list", "--user", ALICE.subject, "--provider", "github")
    assert code == 0 and ACCESS_TOKEN not in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {plain, expiring}  # BOB's is not ALICE's
    assert "will need the user again at 2031-05-06T07:08:09Z" in lines[expiring]
    assert "will need the user again" not in lines[plain]
    code, everyone, _ = run_cli(connector_env, "grants", "list")
    assert code == 0 and len(everyone.splitlines()) == 4 and ACCESS_TOKEN not in everyone
    code, none, _ = run_cli(connector_env, "grants", "list", "--provider", "google")
    assert code == 0 and len(none.splitlines()) == 1
