"""The `trusted_header` verifier: identity from an authenticating proxy's headers, believed only from trusted peers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from service import AuthorizationStatus, Connector, ElicitationStatus, load_settings
from service.cli import main
from service.core.errors import ConfigError
from service.testing import ScriptedBrowser

from .conftest import ALICE, BOB, Deploy, Deployment
from .identity_support import (
    assert_nothing_happened,
    events,
    last_event,
    logging_restored,
    page_reveals_no_identity,
    started,
)

PROXY = {
    "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
    "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": ALICE.issuer,
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",  # the test's loopback peer plays the proxy
}


@pytest.fixture
def deploy_with(deploy_with: Deploy) -> Deploy:
    """The shared `deploy_with`, behind the proxy: ALICE bound, PROXY settings plus the test's overrides."""

    def make(**overrides: str) -> AbstractAsyncContextManager[Deployment]:
        return deploy_with(ALICE, **{**PROXY, **overrides})

    return make


@pytest.fixture
async def proxied(deploy_with: Deploy) -> AsyncIterator[Deployment]:
    async with deploy_with() as deployment:
        yield deployment


async def test_the_rightful_user_behind_the_proxy_completes(proxied: Deployment) -> None:
    async with started(proxied, ALICE) as pending:
        async with ScriptedBrowser(headers={"X-Forwarded-User": "alice"}) as browser:
            final = await browser.authorize(pending.url)
        assert final.status_code == 200, final.text
        assert "is connected" in final.text
        grants = await proxied.connector.runtime.store.grants.find(ALICE, "github")
        assert len(grants) == 1
        assert "verified" in await events(proxied, pending.elicitation_id)


async def test_phishing_bob_completes_alices_link_is_refused(proxied: Deployment) -> None:
    async with started(proxied, ALICE) as pending:
        async with ScriptedBrowser(headers={"X-Auth-Request-User": "bob"}) as bob:
            page = await bob.get(pending.url)
            refused = await bob.submit(page, "continue")
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "identity_mismatch"
        assert "started by a different account" in refused.text
        assert page_reveals_no_identity(refused.text, ALICE, BOB)
        await assert_nothing_happened(proxied, pending)
        event = await last_event(proxied, "identity_mismatch")
        assert event.elicitation_id == pending.elicitation_id and event.identity == ALICE
        assert event.detail["browser_subject"] == "bob" and event.detail["identity_verifier"] == "trusted_header"

        # The elicitation stays open for the rightful user.
        async with ScriptedBrowser(headers={"X-Forwarded-User": "alice"}) as alice:
            final = await alice.authorize(pending.url)
        assert final.status_code == 200, final.text
        assert len(await proxied.connector.runtime.store.grants.find(ALICE, "github")) == 1


@pytest.mark.parametrize("header", ["X-Forwarded-User", "X-Auth-Request-User"])
async def test_identity_headers_from_an_untrusted_peer_are_refused(deploy_with: Deploy, header: str) -> None:
    # The proxy is elsewhere: our loopback peer is not it. Even the *right* name is refused, not ignored.
    async with deploy_with(CONNECTOR_SERVER__TRUSTED_PROXIES="10.0.0.0/8") as deployment:
        async with started(deployment, ALICE) as pending:
            async with ScriptedBrowser(headers={header: "alice"}) as browser:
                page = await browser.get(pending.url)
                refused = await browser.submit(page, "continue")

            assert refused.status_code == 403
            assert refused.headers["X-Connector-Error"] == "untrusted_identity_header"
            await assert_nothing_happened(deployment, pending)
            event = await last_event(deployment, "untrusted_identity_header")
            assert event.elicitation_id == pending.elicitation_id
            assert event.detail["peer"] == "127.0.0.1" and event.detail["headers"] == [header.lower()]
            assert "identity_mismatch" not in await events(deployment)


async def test_without_identity_headers_nobody_is_signed_in(proxied: Deployment) -> None:
    """Identity never comes from the URL or a form field: only the proxy's header counts."""
    async with started(proxied, ALICE) as pending:
        async with ScriptedBrowser() as browser:
            page = await browser.get(pending.url)
            csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            refused = await browser.client.post(
                f"{pending.url}?user=alice&X-Forwarded-User=alice",
                data={"csrf": csrf, "action": "continue", "user": "alice", "X-Forwarded-User": "alice"},
            )
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "not_signed_in"
        await assert_nothing_happened(proxied, pending)
        assert (await last_event(proxied, "identity_missing")).elicitation_id == pending.elicitation_id


async def test_two_different_users_in_the_headers_are_refused(proxied: Deployment) -> None:
    async with started(proxied, ALICE) as pending:
        async with ScriptedBrowser(headers={"X-Forwarded-User": "alice", "X-Auth-Request-User": "bob"}) as browser:
            page = await browser.get(pending.url)
            refused = await browser.submit(page, "continue")
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "ambiguous_identity"
        await assert_nothing_happened(proxied, pending)
        assert "identity_header_ambiguous" in await events(proxied, pending.elicitation_id)


async def test_email_as_subject(deploy_with: Deploy) -> None:
    user = ALICE.__class__(ALICE.issuer, "alice@example.com")
    async with deploy_with(
        CONNECTOR_IDENTITY__TRUSTED_HEADER__SUBJECT="email",
        CONNECTOR_IDENTITY__TRUSTED_HEADER__EMAIL_HEADER="X-Auth-Request-Email",
    ) as deployment:
        async with started(deployment, user) as pending:
            headers = {"X-Auth-Request-Email": "Alice@Example.com", "X-Forwarded-User": "someone-else"}
            async with ScriptedBrowser(headers=headers) as browser:
                final = await browser.authorize(pending.url)
            assert final.status_code == 200, final.text
            assert len(await deployment.connector.runtime.store.grants.find(user, "github")) == 1


async def test_locked_after_max_mismatches(deploy_with: Deploy) -> None:
    async with deploy_with(CONNECTOR_IDENTITY__MAX_MISMATCHES="3") as deployment:
        store = deployment.connector.runtime.store
        async with started(deployment, ALICE) as pending:
            async with ScriptedBrowser(headers={"X-Forwarded-User": "bob"}) as bob:
                for attempt in (1, 2, 3):
                    page = await bob.get(pending.url)
                    assert page.status_code == 200, f"attempt {attempt}: the link must still be open"
                    refused = await bob.submit(page, "continue")
                    assert refused.status_code == 403 and refused.headers["X-Connector-Error"] == "identity_mismatch"
                    record = await store.elicitations.get(pending.elicitation_id)
                    assert record is not None
                    if attempt < 3:
                        assert not record.status.terminal
                assert record.status is ElicitationStatus.FAILED
                assert record.failure_reason == "locked after 3 identity mismatches"
                again = await bob.get(pending.url)
                assert again.status_code == 410

            outcome = await pending.task
            assert outcome.stop_reason == "end_turn"
            result = pending.wire.agent.outcomes[0]
            assert result.status is AuthorizationStatus.FAILED and "locked" in (result.reason or "")

            # Even the rightful user cannot use a locked link: the agent must ask again.
            async with ScriptedBrowser(headers={"X-Forwarded-User": "alice"}) as alice:
                closed = await alice.get(pending.url)
            assert closed.status_code == 410
            assert await store.grants.find(ALICE, "github") == []
            trail = await events(deployment, pending.elicitation_id)
            assert trail.count("identity_mismatch") == 3 and trail.count("identity_locked") == 1
            mismatches = await store.audit.list(elicitation_id=pending.elicitation_id, event="identity_mismatch")
            assert [e.detail["mismatches"] for e in mismatches] == [1, 2, 3]


def _settings(tmp_path: Path, connector_env: dict[str, str], **overrides: str):  # type: ignore[no-untyped-def]
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    return load_settings(config_file, env={**connector_env, **overrides})


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": ""}, "identity.trusted_header.issuer"),
        ({"CONNECTOR_SERVER__TRUSTED_PROXIES": "[]"}, "server.trusted_proxies"),
        ({"CONNECTOR_IDENTITY__TRUSTED_HEADER__SUBJECT": "email"}, "identity.trusted_header.email_header"),
    ],
)
def test_incomplete_settings_are_refused(
    tmp_path: Path, connector_env: dict[str, str], overrides: dict[str, str], key: str
) -> None:
    env = {**connector_env, **PROXY, **overrides}
    if overrides.get("CONNECTOR_SERVER__TRUSTED_PROXIES") == "[]":
        env.pop("CONNECTOR_SERVER__TRUSTED_PROXIES")
    settings = _settings(tmp_path, env)
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(settings)
    assert caught.value.key == key


def test_serve_refuses_an_incomplete_verifier(
    tmp_path: Path, connector_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONNECTOR_IDENTITY__VERIFIER", "trusted_header")
    monkeypatch.delenv("CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER", raising=False)
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")

    with logging_restored():
        assert main(["--config", str(config_file), "serve"]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "identity.trusted_header.issuer" in err
