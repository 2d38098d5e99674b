"""An API key asked for by an agent and typed on the connector's own page (issue 26), with the scripted browser:
format check, check request at the provider, encrypted storage, one completion, use through `http()` and
`/v1/proxy`, a 401 that marks the grant `needs_user`, replacing and disconnecting. Chromium and the ACP SDK
client: tests/test_credentials_browser.py."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service import ElicitationStatus
from service.core.records import TokenSet
from service.testing import MockKeyedApi, MockOAuthProvider, ScriptedBrowser
from service.tokens import grant_aad_of
from service.vault import KeyRing, Vault, generate_key

from .api_support import api_client, make_key, user_headers
from .conftest import Deployment
from .credential_support import KEYED, keyed_deployment, to_form, type_key
from .flow_support import asking, assert_nothing_stored, events, status_of
from .test_key_rotation import cli_env, keys_command


async def test_a_typed_key_is_checked_stored_and_used(keyed_env: Deployment, keyed: MockKeyedApi) -> None:
    deployment = keyed_env
    key = keyed.add_key({"id": "acct_42", "name": "Mona"})
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            form = await to_form(browser, pending.url)
            assert 'type="password"' in form.text and 'autocomplete="off"' in form.text
            done = await type_key(browser, form, key)
        assert done.status_code == 200, done.text
        assert "connected" in done.text and key[-4:] in done.text and key not in done.text
        outcome = await pending.outcome()
        assert outcome.ok
        assert pending.client.completions == [pending.elicitation_id]
        (grant,) = await deployment.connector.runtime.store.grants.find(deployment.local_user, KEYED)
        assert grant.provider_account_id == "acct_42"
        assert key.encode() not in grant.token_ciphertext
        async with deployment.connector.http(deployment.local_user, KEYED) as client:
            answer = await client.get("/v1/items")
        assert answer.status_code == 200 and answer.json()["items"]
        assert keyed.presented[-1] == f"Bearer {key}"


@pytest.fixture
async def keyed_env(
    connector_env: dict[str, str],
    tmp_path: Path,
    mock_provider: MockOAuthProvider,
    keyed: MockKeyedApi,
    loopback_socket: socket.socket,
    database_url: str,
) -> AsyncIterator[Deployment]:
    """A deployment with the keyed mock API, on SQLite and on PostgreSQL."""
    async with keyed_deployment(
        connector_env, tmp_path, mock_provider, keyed, loopback_socket, CONNECTOR_DATABASE__URL=database_url
    ) as deployment:
        yield deployment


@pytest.mark.parametrize(
    ("typed", "sentence"),
    [
        ("mk_live_" + "0" * 32, "Keyed Mock API refused this key: invalid_api_key."),  # well-formed, unknown
        ("sk-not-ours-0123456789012345678901234567", "API key must start with mk_live_."),
        ("mk_live_short", "API key must be exactly 40 characters long."),
        ("mk_live_" + "A" * 32, "API key contains characters this provider's keys do not have."),
    ],
    ids=["refused", "wrong-prefix", "too-short", "wrong-characters"],
)
async def test_a_wrong_or_malformed_key_keeps_the_user_on_the_form_and_stores_nothing(
    keyed_env: Deployment, keyed: MockKeyedApi, typed: str, sentence: str
) -> None:
    deployment = keyed_env
    calls = len(keyed.api_calls)
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            form = await to_form(browser, pending.url)
            again = await type_key(browser, form, typed)
            assert again.status_code == 400
            assert sentence in again.text.replace("&#39;", "'")
            assert typed not in again.text and 'type="password"' in again.text  # the form again, nothing echoed
            # The user stays on the form and can still get it right.
            assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.AUTHORIZING
        await assert_nothing_stored(deployment, pending)
        refused = "credential_refused" if "refused" in sentence else "credential_malformed"
        assert refused in await events(deployment, pending.elicitation_id)
    # A malformed key never reaches the provider.
    assert len(keyed.api_calls) == calls + (1 if "refused" in sentence else 0)


async def test_a_check_that_times_out_stores_nothing_and_says_so(keyed_env: Deployment, keyed: MockKeyedApi) -> None:
    deployment = keyed_env
    key = keyed.add_key()
    keyed.check_timeouts = 1
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            form = await to_form(browser, pending.url)
            again = await type_key(browser, form, key)
            assert again.status_code == 400
            assert "Keyed Mock API did not answer the check in time. Nothing was stored; try again." in again.text
            assert key not in again.text
            await assert_nothing_stored(deployment, pending)
            assert "credential_unchecked" in await events(deployment, pending.elicitation_id)
            # The provider answers again: the same form, the same ticket, stored now.
            done = await type_key(browser, again, key)
            assert done.status_code == 200, done.text
        assert (await pending.outcome()).ok


async def test_the_form_is_shown_only_to_the_verified_browser_and_only_once(
    keyed_env: Deployment, keyed: MockKeyedApi
) -> None:
    deployment = keyed_env
    key = keyed.add_key()
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            form = await to_form(browser, pending.url)
            form_url = str(form.url)
            # Another browser with the form's address (and even its fields) gets no form and stores nothing.
            async with ScriptedBrowser() as stranger:
                seen = await stranger.get(form_url)
                assert seen.status_code == 403 and 'type="password"' not in seen.text
                posted = await stranger.client.post(
                    form_url.split("?")[0], data={"csrf": "x", "ticket": form_url.split("ticket=")[1], "api_key": key}
                )
                assert posted.status_code == 403
                await assert_nothing_stored(deployment, pending)
            # The form without its ticket, or with another one, is not open either.
            assert (await browser.get(form_url.split("?")[0])).status_code == 400
            assert (await browser.get(form_url.split("?")[0] + "?ticket=abc")).status_code == 400
            done = await type_key(browser, form, key)
            assert done.status_code == 200
            replayed = await type_key(browser, form, key)  # the same form posted again
            assert replayed.status_code == 409 and "already" in replayed.text.lower()  # already completed
        assert (await pending.outcome()).ok
        assert pending.client.completions == [pending.elicitation_id]


async def test_a_401_marks_the_grant_needs_user_and_asking_again_replaces_the_key(
    keyed_env: Deployment, keyed: MockKeyedApi
) -> None:
    deployment = keyed_env
    connector = deployment.connector
    first = keyed.add_key({"id": "acct_1"})
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            assert (await type_key(browser, await to_form(browser, pending.url), first)).status_code == 200
        assert (await pending.outcome()).ok
        keyed.revoke(first)  # the user revoked it in the provider's console
        heard = []
        stop = connector.on_grant_event(heard.append)
        from service.core.errors import GrantNeedsUser

        with pytest.raises(GrantNeedsUser) as raised:
            async with connector.http(deployment.local_user, KEYED) as client:
                await client.get("/v1/items")
        assert raised.value.reason == "key_rejected"
        assert [e.kind.value for e in heard] == ["grant.needs_user"]
        calls = len(keyed.api_calls)
        with pytest.raises(GrantNeedsUser):  # not sent again until the user replaces it
            async with connector.http(deployment.local_user, KEYED) as client:
                await client.get("/v1/items")
        assert len(keyed.api_calls) == calls
        # Asking again opens a new form; the new key replaces the old one in the same grant.
        second = keyed.add_key({"id": "acct_1"})
        again = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            assert (await type_key(browser, await to_form(browser, again.url), second)).status_code == 200
        assert (await again.outcome()).ok
        stop()
        (grant,) = await connector.runtime.store.grants.find(deployment.local_user, KEYED)
        assert not grant.health.needs_user
        async with connector.http(deployment.local_user, KEYED) as client:
            assert (await client.get("/v1/items")).status_code == 200
        assert keyed.presented[-1] == f"Bearer {second}"
        # Disconnect deletes it (the key stays valid at the provider: the page said where to revoke it).
        assert await connector.disconnect(deployment.local_user, KEYED) == 1
        assert await connector.runtime.store.grants.find(deployment.local_user, KEYED) == []
        assert second in keyed.keys


async def test_through_v1_the_proxy_injects_the_key_and_it_never_comes_back(
    keyed_env: Deployment, keyed: MockKeyedApi, captured_logs: pytest.LogCaptureFixture
) -> None:
    deployment = keyed_env
    key = keyed.add_key()
    api_key = await make_key(deployment.connector.runtime.store)
    user = deployment.local_user
    async with api_client(deployment.base_url, api_key) as api:
        created = await api.post(
            "/v1/elicitations",
            json={
                "user": {"issuer": user.issuer, "subject": user.subject},
                "provider": KEYED,
                "scope": {"sessionId": "sess-1", "toolCallId": "call-1"},
            },
        )
        assert created.status_code == 201, created.text
        body = created.json()
        eid = body["elicitationId"]
        assert (await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "accept"})).status_code == 200
        async with ScriptedBrowser() as browser:
            assert (await type_key(browser, await to_form(browser, body["url"]), key)).status_code == 200
        waited = await api.get(f"/v1/elicitations/{eid}", params={"wait": "5"})
        assert waited.json()["status"] == "completed", waited.text
        assert waited.json()["grant"]["accountId"] == keyed.keys[key]["id"]
        proxied = await api.get(f"/v1/proxy/{KEYED}/v1/items", headers=user_headers(user))
        assert proxied.status_code == 200 and proxied.json()["items"]
        assert keyed.presented[-1] == f"Bearer {key}"
        grants = await api.get("/v1/grants", headers=user_headers(user))
        answers = created.text + waited.text + proxied.text + grants.text + str(dict(proxied.headers))
    log_text = "\n".join(r.getMessage() for r in captured_logs.records)
    audit = str([a.detail for a in await deployment.connector.runtime.store.audit.list()])
    for where in (answers, log_text, audit):
        assert key not in where and key[8:] not in where


async def test_keys_rotate_re_encrypts_a_stored_key_and_the_old_vault_key_retires(
    keyed_env: Deployment, keyed: MockKeyedApi, connector_env: dict[str, str], tmp_path: Path, database_url: str
) -> None:
    deployment = keyed_env
    key = keyed.add_key({"id": "acct_rot"})
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        async with ScriptedBrowser() as browser:
            assert (await type_key(browser, await to_form(browser, pending.url), key)).status_code == 200
        assert (await pending.outcome()).ok
    store = deployment.connector.runtime.store
    (before,) = await store.grants.find(deployment.local_user, KEYED)
    assert before.token_key_id == "k1"
    new_key = generate_key("k2")
    env = cli_env(database_url, f"{new_key},{connector_env['CONNECTOR_VAULT__KEYS']}")
    code, _, err = await keys_command(tmp_path, env, "rotate")
    assert code == 0, err
    (after,) = await store.grants.find(deployment.local_user, KEYED)
    assert after.token_key_id == "k2" and after.token_ciphertext != before.token_ciphertext
    only_new = Vault(KeyRing.from_strings([new_key]))
    sealed = only_new.decrypt_json(after.token_key_id, after.token_ciphertext, aad=grant_aad_of(after))
    tokens = TokenSet.from_json(sealed)
    assert tokens.credential == {"api_key": key} and tokens.token_type == "api_key"
    code, _, err = await keys_command(tmp_path, env, "retire", "k1")
    assert code == 0, err


async def test_the_demo_serves_an_api_key_provider_beside_the_oauth_one(
    connector_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` (`serve --demo`): the demo catalog has the mock OAuth provider and `demo-key`, a credential entry
    at a keyed mock API on loopback whose check request accepts the demo key it prints, and nothing else."""
    from service.cli.serve import DEMO_KEY_PROVIDER, DEMO_PROVIDER, _demo_provider
    from service.config import load_settings
    from service.oauth import ProviderGateway
    from service.providers import load_catalog

    monkeypatch.chdir(tmp_path)  # the demo writes var/demo-providers.toml where it runs
    (tmp_path / "connector.toml").write_text("")
    settings = load_settings(tmp_path / "connector.toml", env=connector_env)
    async with _demo_provider(settings) as (env, demo_key):
        catalog = load_catalog(Path(env["CONNECTOR_PROVIDERS__CATALOG"]), env=env)
        assert catalog.get(DEMO_PROVIDER).configured and not catalog.get(DEMO_PROVIDER).is_credential
        entry = catalog.get(DEMO_KEY_PROVIDER)
        assert entry.is_credential and (entry.api_host or "") == "127.0.0.1"
        gateway = ProviderGateway(catalog)
        try:
            provider = await gateway.resolve(DEMO_KEY_PROVIDER)
            assert (await gateway.check_credential(provider, {"api_key": demo_key})).account_id == "demo-account"
            wrong = "mk_live_" + "0" * 32
            assert (await gateway.check_credential(provider, {"api_key": wrong})).refusal is not None
        finally:
            await gateway.aclose()


async def test_the_form_is_rate_limited_size_limited_and_sent_with_the_consent_pages_headers(
    connector_env: dict[str, str],
    tmp_path: Path,
    mock_provider: MockOAuthProvider,
    keyed: MockKeyedApi,
    loopback_socket: socket.socket,
) -> None:
    key = keyed.add_key()
    async with (
        keyed_deployment(
            connector_env,
            tmp_path,
            mock_provider,
            keyed,
            loopback_socket,
            CONNECTOR_RATE_LIMIT__CONNECT_PER_ELICITATION="5",
        ) as deployment,
        asking(deployment) as ask,
    ):
        pending = await ask(provider=KEYED, scopes=())
        record = await deployment.connector.elicitation(pending.elicitation_id)
        assert record is not None
        assert (
            record.message == "Enter your Keyed Mock API API key on the connector's page; it is sent only to 127.0.0.1."
        )
        async with ScriptedBrowser() as browser:
            form = await to_form(browser, pending.url)  # three requests: the link, Continue, the form
            consent = browser.responses[0]
            for header in ("content-security-policy", "cache-control", "x-frame-options", "referrer-policy"):
                assert form.headers[header] == consent.headers[header] or header == "content-security-policy"
            assert "frame-ancestors 'none'" in form.headers["content-security-policy"]
            assert form.headers["cache-control"] == "no-store"
            # A body over the form's limit is refused while it streams; nothing is stored.
            oversized = await browser.client.post(
                str(form.url).split("?")[0], data={"api_key": "x" * 20_000, "csrf": "a", "ticket": "b"}
            )
            assert oversized.status_code == 413
            # Wrong keys count against the elicitation's limit like every request to the connect pages.
            assert (await type_key(browser, form, "mk_live_" + "1" * 32)).status_code == 400
            limited = await type_key(browser, form, "mk_live_" + "2" * 32)
            assert limited.status_code == 429 and limited.headers["x-connector-error"] == "rate_limited"
            assert key not in limited.text
        await assert_nothing_stored(deployment, pending)
