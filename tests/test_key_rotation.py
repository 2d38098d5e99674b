"""Key rotation re-encrypts every grant and every webhook endpoint's signing secret (on SQLite and PostgreSQL).

`acp-connector keys rotate`, a separate process, is killed with SIGKILL half way and run again: every grant then
decrypts, is under the new key, and holds the very tokens it held before; every webhook secret is under the new key
and deliveries signed after it verify with the secret the receiver was given; `keys retire` refuses the old key
while a grant or a webhook secret uses it and succeeds after. A grant refreshed by another replica while it is being
rotated keeps its new tokens."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import stat
import sys
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from service import Identity, verify_webhook
from service.client import WebhookVerificationError
from service.core.errors import VaultError
from service.core.events import ElicitationEvent
from service.core.handles import grant_aad, new_id
from service.core.records import GrantRecord
from service.core.states import ElicitationStatus
from service.core.webhooks import WebhookDispatcher, WebhookEndpoints, WebhookPolicy
from service.events import HttpWebhookSender
from service.rotation import key_usage, rotate_grants, rotate_webhook_secrets
from service.store import Store, migrate
from service.vault import KeyRing, Vault, generate_key, remove_from_key_file

from .test_api_webhooks import receiving

GRANTS = 1000
TENANTS = ("agent-a", "agent-b")
ENDPOINTS_PER_TENANT = 6  # twelve endpoints: two batches of ten
ROTATED_PER_TENANT = 3  # of which six had their secret rotated: they hold a previous secret, signing for a week
WEBHOOK_SECRETS = len(TENANTS) * (ENDPOINTS_PER_TENANT + ROTATED_PER_TENANT)  # eighteen, current and previous
KEY_A = generate_key("key-a")
KEY_B = generate_key("key-b")
ISSUER = "https://login.example.com"
NOW = datetime(2026, 12, 14, 12, 0, tzinfo=UTC)


def vault(*keys: str) -> Vault:
    return Vault(KeyRing.from_strings(list(keys)))


def aad_of(grant: GrantRecord) -> bytes:
    return grant_aad(grant.identity.issuer, grant.identity.subject, grant.provider, grant.provider_account_id)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    migrate(database_url)
    store = Store.from_url(database_url)
    try:
        yield store
    finally:
        await store.close()


async def seed(store: Store, under: Vault, count: int) -> None:
    async with store.transaction() as tx:
        for number in range(count):
            identity = Identity(ISSUER, f"user-{number}")
            aad = grant_aad(identity.issuer, identity.subject, "github", f"account-{number}")
            tokens = {"access_token": f"gho_{new_id(12)}", "refresh_token": f"ghr_{new_id(12)}", "n": number}
            key_id, blob = under.encrypt_json(tokens, aad=aad)
            await store.grants.upsert(
                GrantRecord(
                    id=new_id(16),
                    identity=identity,
                    provider="github",
                    provider_account_id=f"account-{number}",
                    scopes=("repo",),
                    token_key_id=key_id,
                    token_ciphertext=blob,
                    token_expires_at=None,
                    created_at=NOW,
                    updated_at=NOW,
                ),
                conn=tx,
            )


def webhooks(store: Store, under: Vault) -> WebhookEndpoints:
    return WebhookEndpoints(
        store.webhooks, store.outbox, under, WebhookPolicy(allow_private_addresses=True), lambda: datetime.now(UTC)
    )


async def seed_webhooks(store: Store, under: Vault, url: str) -> dict[str, set[str]]:
    """`ENDPOINTS_PER_TENANT` endpoints for each of `TENANTS`, secrets under `under`'s key, the first
    `ROTATED_PER_TENANT` of each tenant's with a rotated secret: {endpoint id: the secrets that sign for it}."""
    endpoints = webhooks(store, under)
    found: dict[str, set[str]] = {}
    for tenant in TENANTS:
        for number in range(ENDPOINTS_PER_TENANT):
            endpoint, secret = await endpoints.create(tenant, url, None)
            found[endpoint.id] = {secret}
            if number < ROTATED_PER_TENANT:
                _, new = await endpoints.rotate_secret(endpoint, timedelta(days=7))
                found[endpoint.id].add(new)
    return found


async def all_grants(store: Store) -> list[GrantRecord]:
    return await store.grants.not_under("", limit=10 * GRANTS)  # no key id is empty: every grant


async def tokens_of(store: Store, ring: Vault) -> dict[str, Any]:
    return {g.id: ring.decrypt_json(g.token_key_id, g.token_ciphertext, aad=aad_of(g)) for g in await all_grants(store)}


def cli_env(database_url: str, keys: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    # This checkout's code, whichever checkout the environment's editable install points at.
    return {**env, "CONNECTOR_DATABASE__URL": database_url, "CONNECTOR_VAULT__KEYS": keys, "PYTHONPATH": str(REPO)}


CLI = (sys.executable, "-m", "service.cli")
REPO = Path(__file__).resolve().parents[1]


async def keys_command(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run `acp-connector keys ARGS`: (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        *CLI, "keys", *args, cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.duration(12)
async def test_rotation_killed_half_way_resumes_and_the_old_key_retires(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    await seed(store, vault(KEY_A), GRANTS)
    before = await tokens_of(store, vault(KEY_A))
    assert await store.grants.count_by_key() == {"key-a": GRANTS}
    async with receiving() as receiver:
        secrets = await seed_webhooks(store, vault(KEY_A), receiver.url)
        assert await store.webhooks.count_by_key() == {"key-a": WEBHOOK_SECRETS}
        env = cli_env(database_url, f"{KEY_B},{KEY_A}")  # key-b is now the active key; key-a still decrypts

        # Ten rows per transaction, a pause between batches: plenty of time to kill it half way.
        rotating = await asyncio.create_subprocess_exec(
            *CLI,
            "keys",
            "rotate",
            "--batch-size",
            "10",
            "--pause",
            "0.02",
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            for _ in range(6000):
                moved = (await store.grants.count_by_key()).get("key-b", 0)
                if moved >= GRANTS // 4 or rotating.returncode is not None:
                    break
                await asyncio.sleep(0.01)
            assert rotating.returncode is None, "rotate finished before it could be killed"
            rotating.send_signal(signal.SIGKILL)
        finally:
            if rotating.returncode is None:
                rotating.kill()
            await rotating.wait()
        assert rotating.returncode == -signal.SIGKILL

        half = await store.grants.count_by_key()
        assert 0 < half["key-b"] < GRANTS and half["key-a"] + half["key-b"] == GRANTS
        assert await tokens_of(store, vault(KEY_B, KEY_A)) == before  # mid-way, every grant still decrypts
        assert await store.webhooks.count_by_key() == {"key-a": WEBHOOK_SECRETS}  # grants go first

        code, _, err = await keys_command(tmp_path, env, "retire", "key-a")
        assert code == 1
        assert f"key-a is still in use: {half['key-a']} grants, {WEBHOOK_SECRETS} webhook secrets and 0 sign-ins" in err
        assert "Traceback" not in err

        code, _, err = await keys_command(tmp_path, env, "rotate")
        assert code == 0, err
        assert f"grants and {WEBHOOK_SECRETS} webhook secrets re-encrypted under the active key key-b" in err
        assert await store.grants.count_by_key() == {"key-b": GRANTS}
        assert await store.webhooks.count_by_key() == {"key-b": WEBHOOK_SECRETS}

        code, out, err = await keys_command(tmp_path, env, "status")
        assert code == 0, err
        lines = [line.split() for line in out.splitlines()]
        assert ["key-b", "active", str(GRANTS), str(WEBHOOK_SECRETS), "0"] in lines
        assert ["key-a", "decrypt", "only", "0", "0", "0"] in lines

        code, _, err = await keys_command(tmp_path, env, "retire", "key-a")
        assert code == 0, err
        assert "remove it from CONNECTOR_VAULT__KEYS" in err
        assert [e.detail for e in await store.audit.list(event="key_retired")] == [{"key_id": "key-a"}]

        # Without key-a at all, every grant reads back the very tokens it held under key-a ...
        assert await tokens_of(store, vault(KEY_B)) == before
        # ... and a delivery signed now verifies with the secret its receiver was given before the rotation.
        await deliver_one_event_per_tenant(store, vault(KEY_B))
    assert len(receiver.requests) == len(secrets)
    every_secret = set().union(*secrets.values())
    verified_by = [
        {secret for secret in every_secret if verifies(secret, request.headers, request.body)}
        for request in receiver.requests
    ]
    # Each endpoint's delivery once; a rotated one's verifies with its previous secret alone and its new one alone.
    assert sorted(map(sorted, verified_by)) == sorted(map(sorted, secrets.values()))
    assert sum(len(found) == 2 for found in verified_by) == len(TENANTS) * ROTATED_PER_TENANT


def verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        verify_webhook(secret, headers, body)
    except WebhookVerificationError:
        return False
    return True


async def deliver_one_event_per_tenant(store: Store, under: Vault) -> None:
    async with store.transaction() as tx:
        events = [ElicitationEvent(new_id(16), ElicitationStatus.COMPLETED, f"v1:{t}:c1") for t in TENANTS]
        await store.outbox.append(events, at=datetime.now(UTC), conn=tx)
    sender = HttpWebhookSender(timeout=10, allow_private=True)
    try:
        dispatcher = WebhookDispatcher(webhooks(store, under), store.outbox, sender, "replica-1")
        assert (
            await dispatcher.step() == len(TENANTS) * ENDPOINTS_PER_TENANT
        )  # every attempt made (and awaited) in this step
    finally:
        await sender.aclose()


class Crashing:
    """The rotating vault (active key-b), which dies after `survive` re-encryptions (the process killed mid-batch)."""

    def __init__(self, new: Vault, survive: int) -> None:
        self.new, self.left = new, survive
        self.primary_key_id = new.primary_key_id

    def reencrypt(self, key_id: str, blob: bytes, *, aad: bytes) -> tuple[str, bytes]:
        if self.left == 0:
            raise SystemExit("killed")
        self.left -= 1
        return self.new.reencrypt(key_id, blob, aad=aad)


async def test_previous_webhook_secrets_are_rotated_resumably_and_sign_under_the_new_key_alone(
    store: Store, tmp_path: Path
) -> None:
    async with receiving() as receiver:
        secrets = await seed_webhooks(store, vault(KEY_A), receiver.url)
        endpoints = len(TENANTS) * ENDPOINTS_PER_TENANT
        # Killed in the previous secrets' first batch of four: the current secrets are done, no previous one is.
        with pytest.raises(SystemExit):
            await rotate_webhook_secrets(store, Crashing(vault(KEY_B, KEY_A), endpoints + 3), batch_size=4)  # type: ignore[arg-type]
        assert await store.webhooks.count_by_key() == {"key-b": endpoints, "key-a": WEBHOOK_SECRETS - endpoints}
        assert (await key_usage(store, NOW))["key-a"].in_use  # so `keys retire key-a` is refused

        report = await rotate_webhook_secrets(store, vault(KEY_B, KEY_A), batch_size=4)
        assert (report.rotated, report.complete) == (WEBHOOK_SECRETS - endpoints, True)
        assert await store.webhooks.count_by_key() == {"key-b": WEBHOOK_SECRETS}
        assert "key-a" not in await key_usage(store, NOW)
        await deliver_one_event_per_tenant(store, vault(KEY_B))  # key-a gone from the ring
    verified_by = [
        {secret for secret in set().union(*secrets.values()) if verifies(secret, r.headers, r.body)}
        for r in receiver.requests
    ]
    assert sorted(map(sorted, verified_by)) == sorted(map(sorted, secrets.values()))


async def test_a_grant_refreshed_on_another_replica_while_rotating_keeps_its_new_tokens(store: Store) -> None:
    old = vault(KEY_A)
    await seed(store, old, 30)
    target = (await all_grants(store))[10]  # the first of the second batch of ten
    refreshed = {"access_token": "gho_refreshed_elsewhere", "n": -1}
    racing = Racing(vault(KEY_B, KEY_A), old, store, target, refreshed)
    report = await rotate_grants(store, racing, batch_size=10)  # type: ignore[arg-type]
    assert racing.refreshed_once and report.changed_meanwhile == 1 and report.complete
    assert await store.grants.count_by_key() == {"key-b": 30}  # picked up again on the next pass
    final = await tokens_of(store, vault(KEY_B))
    assert final[target.id] == refreshed  # the refresh won: rotation did not put the old tokens back
    assert [tokens for tokens in final.values() if tokens == refreshed] == [refreshed]


class Racing:
    """The rotating vault (active key-b), except that while it re-encrypts one grant, another replica's refresh of
    that grant commits (its own engine, its own thread): it lands between rotate's read and rotate's write."""

    def __init__(self, new: Vault, old: Vault, store: Store, target: GrantRecord, refreshed: dict[str, Any]) -> None:
        self.new, self.old, self.store, self.target, self.refreshed = new, old, store, target, refreshed
        self.primary_key_id = new.primary_key_id
        self.refreshed_once = False

    def reencrypt(self, key_id: str, blob: bytes, *, aad: bytes) -> tuple[str, bytes]:
        if aad == aad_of(self.target) and not self.refreshed_once:
            self.refreshed_once = True
            fresh_key, fresh = self.old.encrypt_json(self.refreshed, aad=aad)  # that replica still writes key-a
            url = self.store.engine.url.render_as_string(hide_password=False)
            thread = threading.Thread(
                target=asyncio.run, args=(refresh_elsewhere(url, self.target.id, fresh_key, fresh),)
            )
            thread.start()
            thread.join()
        return self.new.reencrypt(key_id, blob, aad=aad)


async def refresh_elsewhere(url: str, grant_id: str, key_id: str, blob: bytes) -> None:
    other = Store.from_url(url)
    try:
        stored = await other.grants.get(grant_id)
        assert stored is not None
        await other.grants.update_tokens(
            grant_id,
            token_key_id=key_id,
            token_ciphertext=blob,
            token_expires_at=None,
            scopes=("repo",),
            now=NOW,
            replacing=stored.token_ciphertext,
        )
    finally:
        await other.close()


def test_retiring_a_key_takes_it_out_of_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "vault.keys"
    path.write_text(f"# rotated 2026-12\n{KEY_B}\n{KEY_A}  # the old one\n")
    path.chmod(0o600)
    assert remove_from_key_file(path, "key-a") is True
    assert path.read_text() == f"# rotated 2026-12\n{KEY_B}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert KeyRing.from_file(path).key_ids == ("key-b",)
    assert remove_from_key_file(path, "key-a") is False
    with pytest.raises(VaultError, match="would hold no key"):
        remove_from_key_file(path, "key-b")
    assert KeyRing.from_file(path).key_ids == ("key-b",)


def sqlite_files(database_url: str) -> bytes:
    """The bytes of a SQLite database's files: the database, its write-ahead log and the log's index."""
    database = Path(make_url(database_url).database or "")
    return b"".join(path.read_bytes() for path in sorted(database.parent.glob(database.name + "*")))


def found_in(files: bytes, blobs: list[bytes]) -> list[bytes]:
    """The blobs any 16 bytes of which (their start, middle or end) are in `files`."""
    return [blob for blob in blobs if any(blob[at : at + 16] in files for at in (0, len(blob) // 2, len(blob) - 16))]


SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # its own files


@SQLITE_ONLY
async def test_after_retiring_a_key_no_ciphertext_under_it_is_left_in_the_sqlite_files(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    """A copy of the database taken after `keys retire` holds nothing the retired key opens: not the records
    `keys rotate` rewrote, not the page images written before them into the log."""
    await seed(store, vault(KEY_A), 200)
    old = [grant.token_ciphertext for grant in await all_grants(store)]
    env = cli_env(database_url, f"{KEY_B},{KEY_A}")
    for command in (("rotate",), ("retire", "key-a")):
        code, _, err = await keys_command(tmp_path, env, *command)
        assert code == 0, err
        assert "write-ahead log" not in err
    new = [grant.token_ciphertext for grant in await all_grants(store)]
    files = sqlite_files(database_url)
    assert found_in(files, new) == new  # the scan reads where the records are
    assert found_in(files, old) == []


@SQLITE_ONLY
async def test_a_deleted_grant_leaves_no_ciphertext_in_the_sqlite_file(store: Store, database_url: str) -> None:
    await seed(store, vault(KEY_A), 200)
    grants = await all_grants(store)
    for grant in grants[::4]:  # disconnected: spread over the pages, which keep their other records
        assert await store.grants.delete(grant.id)
    assert await store.db.truncate_write_ahead_log() is True
    files = sqlite_files(database_url)
    kept = [grant.token_ciphertext for index, grant in enumerate(grants) if index % 4]
    assert found_in(files, kept) == kept
    assert found_in(files, [grant.token_ciphertext for grant in grants[::4]]) == []


async def test_retiring_a_key_again_only_truncates_the_log(store: Store, database_url: str, tmp_path: Path) -> None:
    code, _, err = await keys_command(tmp_path, cli_env(database_url, KEY_B), "retire", "key-a")
    assert code == 1 and "no key key-a in the ring or the database" in err
    await store.audit.record("key_retired", detail={"key_id": "key-a"})
    code, _, err = await keys_command(tmp_path, cli_env(database_url, KEY_B), "retire", "key-a")
    assert code == 0, err
    assert [e.detail for e in await store.audit.list(event="key_retired")] == [{"key_id": "key-a"}]


@SQLITE_ONLY
@pytest.mark.duration(7)
async def test_retiring_a_key_while_the_log_is_held_says_to_run_it_again(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    reader = sqlite3.connect(make_url(database_url).database or "", isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM grants").fetchall()  # a snapshot the checkpoint must wait for
        await store.audit.record("key_retired", detail={"key_id": "key-a"})  # past it: the log has a frame to keep
        code, _, err = await keys_command(tmp_path, cli_env(database_url, KEY_B), "retire", "key-a")
    finally:
        reader.close()
    assert code == 0, err
    assert "write-ahead log" in err and "run `acp-connector keys retire key-a` again when the connector is idle" in err
    code, _, err = await keys_command(tmp_path, cli_env(database_url, KEY_B), "retire", "key-a")
    assert code == 0 and "write-ahead log" not in err, err
