"""The `local` verifier (one user, one machine), the mismatch page, and the verification store underneath."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic import command

from service import Connector, Identity, load_settings
from service.cli import main
from service.core.errors import ConfigError
from service.core.records import VerificationRecord
from service.store import Store, alembic_config, migrate
from service.testing import ScriptedBrowser

from .conftest import ALICE, BOB, Deployment
from .identity_support import assert_nothing_happened, last_event, logging_restored, page_reveals_no_identity, started


async def test_phishing_a_link_bound_to_bob_is_refused_in_alices_local_browser(deployment: Deployment) -> None:
    """The local user is Alice; the agent bound the link to Bob. Alice's browser must not complete it."""
    assert deployment.local_user == ALICE
    async with started(deployment, BOB) as pending:
        async with ScriptedBrowser() as browser:
            page = await browser.get(pending.url)
            refused = await browser.submit(page, "continue")
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "identity_mismatch"
        assert "started by a different account" in refused.text
        assert page_reveals_no_identity(refused.text, ALICE, BOB)
        await assert_nothing_happened(deployment, pending)
        assert await deployment.connector.runtime.store.grants.find(ALICE, "github") == []
        event = await last_event(deployment, "identity_mismatch")
        assert event.elicitation_id == pending.elicitation_id and event.identity == BOB
        assert event.detail["identity_verifier"] == "local" and event.detail["browser_subject"] == "alice"


@pytest.mark.parametrize(
    ("setting", "value", "key"),
    [
        ("CONNECTOR_SERVER__HOST", "0.0.0.0", "server.host"),  # noqa: S104 - the value under test
        ("CONNECTOR_PUBLIC_BASE_URL", "https://connector.example.com", "public_base_url"),
        ("CONNECTOR_SERVER__TRUSTED_PROXIES", "10.0.0.0/8", "server.trusted_proxies"),
    ],
)
def test_local_refuses_to_start_where_others_can_reach_it(
    tmp_path: Path, connector_env: dict[str, str], setting: str, value: str, key: str
) -> None:
    """`local` refuses to start behind a public URL or a trusted proxy unless told it is safe (once it started
    without a word)."""
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    settings = load_settings(config_file, env={**connector_env, setting: value})
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(settings)
    assert caught.value.key == key
    assert "identity.local.unsafe_allow_remote" in caught.value.problem and setting in caught.value.problem


@pytest.mark.parametrize(
    "setting",
    [
        ("CONNECTOR_PUBLIC_BASE_URL", "https://connector.example.com"),
        ("CONNECTOR_SERVER__TRUSTED_PROXIES", "10.0.0.1/32"),
    ],
)
def test_the_override_starts_local_anyway_and_says_so_loudly(
    tmp_path: Path, connector_env: dict[str, str], caplog: pytest.LogCaptureFixture, setting: tuple[str, str]
) -> None:
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    env = {**connector_env, setting[0]: setting[1], "CONNECTOR_IDENTITY__LOCAL__UNSAFE_ALLOW_REMOTE": "true"}
    with caplog.at_level("WARNING", logger="service.identity.local"):
        connector = Connector.from_settings(load_settings(config_file, env=env))
    assert connector.verifier.user() == ALICE
    [line] = [r for r in caplog.records if r.name == "service.identity.local"]
    assert line.levelname == "WARNING" and line.getMessage().startswith("UNSAFE:")
    assert "unsafe_allow_remote" in line.getMessage()


def test_serve_refuses_local_on_a_non_loopback_bind(
    tmp_path: Path, connector_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONNECTOR_SERVER__HOST", "0.0.0.0")  # noqa: S104 - the value under test
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    with logging_restored():
        assert main(["--config", str(config_file), "serve"]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "server.host" in err and "loopback" in err


# -- the verification store --------------------------------------------------------------------------------


def _verification(elicitation_id: str, now: datetime, **changes: object) -> VerificationRecord:
    values: dict[str, object] = {
        "id": "v-1",
        "elicitation_id": elicitation_id,
        "verifier": "confirm",
        "handle_hash": "h" * 64,
        "return_hash": None,
        "browser_binding_hash": "b" * 64,
        "nonce": None,
        "pkce_key_id": None,
        "pkce_ciphertext": None,
        "outcome": None,
        "identity": None,
        "created_at": now,
        "expires_at": now + timedelta(minutes=10),
        "confirmed_at": None,
        "used_at": None,
    }
    values.update(changes)
    return VerificationRecord(**values)  # type: ignore[arg-type]


async def _store_with_elicitation(tmp_path: Path) -> tuple[Store, str]:
    from .test_store import elicitation  # the store tests' record factory

    url = f"sqlite+aiosqlite:///{tmp_path / 'v.db'}"
    migrate(url)
    store = Store.from_url(url)
    record = elicitation()
    await store.elicitations.insert(record)
    return store, record.id


async def test_confirm_rows_are_answered_once_and_claimed_once(tmp_path: Path) -> None:
    store, elicitation_id = await _store_with_elicitation(tmp_path)
    now = datetime.now(UTC)
    try:
        await store.verifications.insert(_verification(elicitation_id, now))
        assert await store.verifications.claim("v-1", now) is None  # not confirmed yet: cannot be claimed
        alice = Identity("https://login.example.com", "alice")
        answers = await asyncio.gather(
            *(
                store.verifications.confirm("v-1", identity=alice, outcome="confirmed", return_hash=f"r{i}", now=now)
                for i in range(5)
            )
        )
        assert sum(a is not None for a in answers) == 1
        claims = await asyncio.gather(*(store.verifications.claim("v-1", now) for _ in range(5)))
        winners = [c for c in claims if c is not None]
        assert len(winners) == 1 and winners[0].identity == alice and winners[0].outcome == "confirmed"
        assert repr(winners[0]).count("nonce") == 0 and "pkce_ciphertext" not in repr(winners[0])
    finally:
        await store.close()


async def test_expired_rows_are_neither_answered_nor_claimed(tmp_path: Path) -> None:
    store, elicitation_id = await _store_with_elicitation(tmp_path)
    now = datetime.now(UTC)
    try:
        await store.verifications.insert(_verification(elicitation_id, now, expires_at=now - timedelta(seconds=1)))
        alice = Identity("https://login.example.com", "alice")
        assert await store.verifications.confirm("v-1", identity=alice, outcome="x", return_hash="r", now=now) is None
        await store.verifications.insert(
            _verification(elicitation_id, now, id="v-2", verifier="oidc", handle_hash="g" * 64, expires_at=now)
        )
        assert await store.verifications.claim("v-2", now) is None
    finally:
        await store.close()


async def test_mismatch_counter_is_atomic(tmp_path: Path) -> None:
    store, elicitation_id = await _store_with_elicitation(tmp_path)
    now = datetime.now(UTC)
    try:
        counts = await asyncio.gather(
            *(store.elicitations.add_identity_mismatch(elicitation_id, now=now) for _ in range(10))
        )
        assert sorted(counts) == list(range(1, 11))
        assert await store.elicitations.add_identity_mismatch("no-such-id", now=now) == 0
    finally:
        await store.close()


def test_migration_0002_keeps_existing_rows(tmp_path: Path) -> None:
    """Upgrading a 0001 database with an elicitation and its OAuth flow loses neither (no table copy)."""
    db = tmp_path / "old.db"
    url = f"sqlite+aiosqlite:///{db}"
    command.upgrade(alembic_config(url), "0001")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(
            "INSERT INTO elicitations VALUES ('e1','c','i','s','github','[]','session',NULL,NULL,NULL,'a','m',"
            "'pending',NULL,'2026-01-01 00:00:00','2026-01-01 00:10:00','2026-01-01 00:00:00')"
        )
        conn.execute(
            "INSERT INTO oauth_flows VALUES ('f1','e1','sh',NULL,NULL,NULL,NULL,'bh','http://x',"
            "'2026-01-01 00:00:00','2026-01-01 00:10:00',NULL)"
        )
    migrate(url)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, identity_mismatches FROM elicitations").fetchall() == [("e1", 0)]
        assert conn.execute("SELECT id FROM oauth_flows").fetchall() == [("f1",)]
    command.downgrade(alembic_config(url), "0001")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id FROM oauth_flows").fetchall() == [("f1",)]
        assert "identity_verifications" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
