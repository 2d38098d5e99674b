"""A legacy grant (a non-expiring token, no refresh token) at a provider whose entry says how to migrate it
(`legacy_token_exchange`: the shipped Shopify entry) is migrated at its first use, once, then refreshed as usual.

The provider is the mock emulating the shipped `[shopify]` entry (`EmulatedProvider.like("shopify")`: the token
exchange as Shopify's library sends it, JSON with expiring=1; the old token dead after it; a retry with the same
token answers the same pair). The connector is the provider lab's (SQLite, real loopback server, `/v1/proxy`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from service import GrantNeedsUser
from service.core.records import GrantRecord
from service.testing.mock_legacy import TOKEN_EXCHANGE
from service.testing.mock_like import EmulatedProvider

from .migration_support import legacy_tokens, seed_grant, stored_set
from .provider_lab import USER, ProviderLab, provider_lab


@pytest.fixture
async def lab(tmp_path: Path) -> AsyncIterator[ProviderLab]:
    async with provider_lab(tmp_path, ["shopify"]) as running:
        yield running


def shopify(lab: ProviderLab) -> EmulatedProvider:
    return lab.mocks["shopify"]


async def legacy_grant(lab: ProviderLab) -> tuple[GrantRecord, str]:
    """A legacy grant of the lab's user at Shopify, and its token (live at the mock)."""
    token = shopify(lab).issue_legacy_token(scope="read_products")
    runtime = lab.connector.runtime
    grant = await seed_grant(runtime.store, runtime.vault, USER, "shopify", legacy_tokens(token))
    return grant, token


def exchange_requests(mock: EmulatedProvider) -> int:
    return sum(1 for request in mock.token_requests if request["grant_type"] == TOKEN_EXCHANGE)


async def stored(lab: ProviderLab, grant_id: str) -> GrantRecord:
    grant = await lab.connector.runtime.store.grants.get(grant_id)
    assert grant is not None
    return grant


async def use(lab: ProviderLab, path: str) -> int:
    if path == "http":
        return (await lab.use("shopify", "probe")).status_code
    return (await lab.proxy("shopify", "probe")).status_code


@pytest.mark.parametrize("first", ["http", "proxy"])
async def test_a_legacy_grant_is_migrated_once_at_its_first_use_then_refreshed_as_usual(
    lab: ProviderLab, first: str
) -> None:
    mock = shopify(lab)
    grant, old = await legacy_grant(lab)

    assert await use(lab, first) == 200
    # One exchange, as Shopify's library sends it; the API call that answered 200 carried the new token (the mock
    # refuses the old one from the exchange on).
    assert exchange_requests(mock) == 1 and mock.legacy.exchanges == {old: 1}
    assert not mock.token_active(old)
    after = await stored(lab, grant.id)
    tokens = stored_set(after, lab.connector.runtime.vault)
    assert tokens["access_token"] == mock.issued_access_tokens[-1] != old
    assert tokens["refresh_token"] == mock.issued_refresh_tokens[-1]
    assert tokens["expires_at"] is not None and after.token_expires_at is not None
    assert tokens["connection"] == {"subdomain": "acme"}
    for token in (old, tokens["access_token"], tokens["refresh_token"]):
        assert token.encode() not in after.token_ciphertext  # stored encrypted
    migrated = await lab.connector.runtime.store.audit.list(event="token_migrated")
    assert [(e.provider, e.detail) for e in migrated] == [("shopify", {"grant_id": grant.id})]

    # Used again, both ways: no further exchange.
    assert await use(lab, "proxy") == 200 and await use(lab, "http") == 200
    assert exchange_requests(mock) == 1

    # From here the grant is an expiring one: a rejected token is refreshed as any other (rotating).
    mock.expire_access_tokens()
    refreshes = sum(1 for r in mock.token_requests if r["grant_type"] == "refresh_token")
    assert await use(lab, "http") == 200
    assert sum(1 for r in mock.token_requests if r["grant_type"] == "refresh_token") == refreshes + 1
    refreshed = stored_set(await stored(lab, grant.id), lab.connector.runtime.vault)
    assert refreshed["refresh_token"] == mock.issued_refresh_tokens[-1] != tokens["refresh_token"]
    assert exchange_requests(mock) == 1
    metrics = (await lab.connector.runtime.metrics.render())[0].decode()
    assert 'acp_connector_token_refreshes_total{provider="shopify",result="migrated"} 1.0' in metrics


async def test_many_concurrent_uses_of_a_legacy_grant_make_one_exchange(lab: ProviderLab) -> None:
    mock = shopify(lab)
    await legacy_grant(lab)
    statuses = await asyncio.gather(*(use(lab, "http" if n % 2 else "proxy") for n in range(40)))
    assert statuses == [200] * 40
    assert exchange_requests(mock) == 1
    assert len(await lab.connector.runtime.store.audit.list(event="token_migrated")) == 1


async def test_a_refused_legacy_token_needs_the_user_with_a_reason(
    lab: ProviderLab, captured_logs: pytest.LogCaptureFixture
) -> None:
    mock = shopify(lab)
    grant, _ = await legacy_grant(lab)
    mock.expire_access_tokens()  # the shop uninstalled the app: the legacy token is dead, its exchange refused

    with pytest.raises(GrantNeedsUser) as refused:
        await lab.use("shopify", "probe")
    assert refused.value.reason == "revoked"
    assert refused.value.sentence == "Shopify access was revoked or has expired on Shopify's side"
    proxied = await lab.proxy("shopify", "probe")
    assert proxied.status_code == 403, proxied.text
    assert proxied.json()["error"]["code"] == "grant_needs_user"
    assert "revoked or has expired on Shopify's side" in proxied.text
    assert exchange_requests(mock) == 1  # needs_user: never tried again
    assert (await stored(lab, grant.id)).health.needs_user
    events = await lab.connector.runtime.store.audit.list()
    failed = [e.detail for e in events if e.event == "token_migration_failed"]
    assert failed == [{"grant_id": grant.id, "reason": "provider_token_error", "verdict": "needs_user"}]
    assert [e.detail for e in events if e.event == "grant_needs_user"] == [{"grant_id": grant.id, "reason": "revoked"}]
    assert_no_secret(mock, captured_logs, [proxied.text, str(refused.value), *map(str, events)])


async def test_a_transient_failure_backs_off_and_never_answers_500(
    lab: ProviderLab, captured_logs: pytest.LogCaptureFixture
) -> None:
    mock = shopify(lab)
    grant, old = await legacy_grant(lab)
    mock.token_outages = [(503, {})]

    # The exchange answered 503: the legacy token still works, so the call is served with it meanwhile.
    assert await use(lab, "http") == 200
    backing_off = await stored(lab, grant.id)
    assert backing_off.health.failures == 1 and backing_off.health.next_attempt_at is not None
    assert stored_set(backing_off, lab.connector.runtime.vault)["access_token"] == old
    (failed,) = await lab.connector.runtime.store.audit.list(event="token_migration_failed")
    assert failed.detail["verdict"] == "unavailable" and failed.detail["failures"] == 1

    # Within the backoff no exchange is tried; once the API refuses the old token (Shopify after the deadline),
    # the caller is told in words, with a Retry-After, and never gets a 500.
    mock.legacy.refuse_api_calls = True
    proxied = await lab.proxy("shopify", "probe")
    assert proxied.status_code == 503, proxied.text
    assert proxied.json()["error"]["code"] == "provider_unavailable" and int(proxied.headers["retry-after"]) >= 1
    assert "could not renew the access token just now" in proxied.text
    assert sum(1 for r in mock.token_requests if r["grant_type"] == TOKEN_EXCHANGE) == 1  # the 503'd one

    # Past the backoff, the next use migrates.
    lab.connector.clock.advance(timedelta(minutes=6))
    assert await use(lab, "proxy") == 200
    healed = await stored(lab, grant.id)
    assert healed.health.failures == 0 and stored_set(healed, lab.connector.runtime.vault)["refresh_token"]
    assert mock.legacy.exchanges == {old: 1}
    assert_no_secret(mock, captured_logs, [proxied.text])


async def test_a_lost_exchange_answer_is_recovered_by_retrying_with_the_same_token(lab: ProviderLab) -> None:
    """Shopify exchanged the token but its answer never arrived: the old token is dead, nothing was stored. The
    retry after the backoff sends the same old token and gets the same pair (Shopify's seven-day recovery)."""
    mock = shopify(lab)
    grant, old = await legacy_grant(lab)
    mock.lose_refresh_answers = 1
    assert await use(lab, "proxy") == 503  # the old token, tried meanwhile, is dead: a clear 503, a Retry-After
    assert stored_set(await stored(lab, grant.id), lab.connector.runtime.vault)["access_token"] == old
    lab.connector.clock.advance(timedelta(minutes=6))
    assert await use(lab, "http") == 200
    assert mock.legacy.exchanges == {old: 2}
    tokens = stored_set(await stored(lab, grant.id), lab.connector.runtime.vault)
    assert len(mock.issued_refresh_tokens) == 1 and tokens["refresh_token"] == mock.issued_refresh_tokens[0]


def assert_no_secret(mock: EmulatedProvider, logs: pytest.LogCaptureFixture, texts: list[str]) -> None:
    secrets = [secret for secret in mock.secrets_issued() if len(secret) > 8]
    lines = [record.getMessage() for record in logs.records] + [str(record.__dict__) for record in logs.records]
    for secret in secrets:
        assert not any(secret in line for line in lines), "a secret was logged"
        assert not any(secret in text for text in texts), "a secret was answered"
    assert logs.records, "nothing was logged: the scan proves nothing"
    assert any(record.levelno >= logging.INFO for record in logs.records)
