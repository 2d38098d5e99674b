"""The OAuth client on the wire: PKCE, exact redirect URI, single-use browser-bound expiring state,
forged and unknown ids, provider errors, one callback per provider, and HTTPS-only configuration.

Every refusal is checked three ways: the answer (status, X-Connector-Error), that nothing was stored or
completed (and no code reached the token endpoint), and the audit event.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import respx
from sqlalchemy import select

from service import ElicitationStatus
from service.config import load_settings
from service.core.errors import ConfigError, ConnectorError
from service.oauth import ProviderGateway, ResolvedProvider
from service.oauth.authorize import authorization_url, new_flow_secrets
from service.providers import ProviderCatalog, ProviderEntry, load_catalog
from service.store.tables import oauth_flows
from service.testing import ScriptedBrowser

from .conftest import Deployment
from .flow_support import (
    answer_to,
    asking,
    assert_nothing_stored,
    events,
    query_of,
    status_of,
    to_callback,
    to_provider,
    with_query,
)


def shift_clock(deployment: Deployment, delta: timedelta) -> None:
    deployment.connector.clock.advance(delta)


# --- the authorization request ------------------------------------------------------------------------


async def test_authorization_request_has_pkce_s256_state_and_the_exact_redirect_uri(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        sent = await to_provider(browser, pending.url)
        location = sent.headers["location"]
        assert location.startswith(deployment.provider.base_url + "/authorize?")  # the configured endpoint only
        query = query_of(location)
        assert query["response_type"] == "code"
        assert query["code_challenge_method"] == "S256"
        assert len(query["code_challenge"]) == 43  # base64url of a SHA-256 digest
        assert query["redirect_uri"] == f"{deployment.base_url}/callback/github"  # one exact URI per provider
        assert len(query["state"]) >= 43
        assert "nonce" not in query  # not an OpenID Connect provider
        # The state is stored only as a hash, the verifier only encrypted.
        async with deployment.connector.runtime.store.engine.connect() as conn:
            rows = (await conn.execute(select(oauth_flows))).mappings().all()
        assert len(rows) == 1
        row_text = repr(dict(rows[0]))
        assert query["state"] not in row_text and query["code_challenge"] not in row_text
        assert rows[0]["redirect_uri"] == query["redirect_uri"]


def test_pkce_is_left_out_only_when_the_provider_entry_turns_it_off() -> None:
    entry = ProviderEntry(
        name="acme", display_name="Acme", authorization_endpoint="https://as.acme.test/authorize", client_id="c"
    )
    for pkce, expected in ((True, True), (False, False)):
        configured = ResolvedProvider.from_entry(
            ProviderEntry(**{**entry.__dict__, "pkce": pkce, "token_endpoint": "https://as.acme.test/token"})
        )
        flow = new_flow_secrets(configured)
        url = authorization_url(configured, redirect_uri="https://c.test/callback/acme", scopes=["a"], flow=flow)
        assert ("code_challenge" in query_of(url)) is expected
        if expected:
            assert query_of(url)["code_challenge_method"] == "S256"


# --- the state: single use, bound to the browser, expiring ----------------------------------------------


async def test_state_replay_is_refused_and_recorded(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        first = await browser.get(callback)
        assert first.status_code == 303, first.text
        replay = await answer_to(browser, callback)
        assert replay.status_code == 400
        assert replay.headers["x-connector-error"] == "state_used"
    assert len(deployment.provider.token_requests) == 1  # the code went to the token endpoint once
    assert len(await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")) == 1
    assert "replay_attempt" in await events(deployment, pending.elicitation_id)


async def test_two_callbacks_at_once_use_the_state_once(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        answers = await asyncio.gather(*(answer_to(browser, callback) for _ in range(4)))
        assert sorted(a.status_code for a in answers) == [303, 400, 400, 400]
        assert {a.headers.get("x-connector-error") for a in answers if a.status_code == 400} == {"state_used"}
    assert len(deployment.provider.token_requests) == 1
    assert len(await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")) == 1


async def test_refusals_that_cross_each_keep_their_page(deployment: Deployment) -> None:
    # A double click on the provider's redirect: both callbacks are refused before the browser follows either.
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        assert (await browser.get(callback)).status_code == 303  # to the done page
        refusals = [await browser.get(callback) for _ in range(2)]
        assert len({r.headers["location"] for r in refusals}) == 2  # a page each
        pages = [await browser.follow(r) for r in refusals]
        assert [(p.status_code, p.headers.get("x-connector-error")) for p in pages] == [(400, "state_used")] * 2


@pytest.mark.parametrize("other_has_cookie", [False, True], ids=["no-cookie", "own-cookie"])
async def test_callback_in_another_browser_is_refused_and_the_rightful_one_still_finishes(
    deployment: Deployment, other_has_cookie: bool
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as alice, ScriptedBrowser() as mallory:
        pending = await ask()
        callback = await to_callback(alice, pending.url)
        if other_has_cookie:
            assert (await mallory.get(pending.url)).status_code == 200  # mallory gets a binding of her own
        stolen = await answer_to(mallory, callback)
        assert stolen.status_code == 403
        assert stolen.headers["x-connector-error"] == "browser_mismatch"
        assert deployment.provider.token_requests == []  # the code was not used
        await assert_nothing_stored(deployment, pending)
        assert "browser_mismatch" in await events(deployment, pending.elicitation_id)
        # The state was not spent by the refused attempt: the browser that started the flow completes it.
        finished = await alice.get(callback)
        assert finished.status_code == 303, finished.text
        assert (await pending.outcome()).ok


@pytest.mark.parametrize("variant", ["random", "tampered", "missing"])
async def test_unknown_forged_and_missing_states_are_refused(deployment: Deployment, variant: str) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        state = query_of(callback)["state"]
        forged = {
            "random": secrets.token_urlsafe(32),
            "tampered": state[:-1] + ("A" if state[-1] != "A" else "B"),
            "missing": None,
        }[variant]
        answer = await answer_to(browser, with_query(callback, state=forged))
        assert answer.status_code == 400
        assert answer.headers["x-connector-error"] == ("missing_state" if forged is None else "unknown_state")
        assert deployment.provider.token_requests == []
        await assert_nothing_stored(deployment, pending)
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.AUTHORIZING
        if forged is not None:
            assert "unknown_state" in await events(deployment)


async def test_expired_state_is_refused_but_the_elicitation_stays_open(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.core.browser.FLOW_TTL", timedelta(seconds=30))
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        shift_clock(deployment, timedelta(seconds=31))
        late = await answer_to(browser, callback)
        assert late.status_code == 400
        assert late.headers["x-connector-error"] == "state_expired"
        assert deployment.provider.token_requests == []
        await assert_nothing_stored(deployment, pending)
        assert "state_expired" in await events(deployment, pending.elicitation_id)
        # The user may start again from the same link: a fresh state, then success.
        again = await browser.get(await to_callback(browser, pending.url))
        assert again.status_code == 303, again.text


async def test_expired_elicitation_refuses_the_page_and_the_callback(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        shift_clock(deployment, timedelta(seconds=deployment.connector.settings.elicitation.ttl_seconds + 1))
        page = await browser.get(pending.url)
        assert page.status_code == 410 and page.headers["x-connector-error"] == "expired"
        late = await answer_to(browser, callback)
        assert late.status_code == 410 and late.headers["x-connector-error"] == "expired"
        assert deployment.provider.token_requests == []
        await assert_nothing_stored(deployment, pending)
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.EXPIRED
        assert "expired" in await events(deployment, pending.elicitation_id)


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/connect/" + secrets.token_urlsafe(24), 404, "unknown_elicitation"),
        ("/connect?elicitationId=" + secrets.token_urlsafe(24), 404, "unknown_elicitation"),
        ("/connect/" + "x" * 300, 400, "invalid_input"),  # not shaped like an id: refused before the store
        ("/connect/%00%27%22%3Cscript%3E", 400, "invalid_input"),
    ],
    ids=["random-id", "random-id-query", "overlong-id", "odd-characters"],
)
async def test_unknown_and_forged_elicitation_ids(deployment: Deployment, path: str, status: int, code: str) -> None:
    async with ScriptedBrowser() as browser:
        page = await browser.get(deployment.base_url + path)
        assert page.status_code == status
        assert page.headers["x-connector-error"] == code
        assert "<script>" not in page.text


async def test_a_form_from_one_elicitation_cannot_drive_another(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        first, second = await ask(), await ask()
        page = await browser.get(first.url)
        form_csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        posted = await browser.client.post(second.url, data={"csrf": form_csrf, "action": "continue"})
        assert posted.status_code == 403 and posted.headers["x-connector-error"] == "csrf_failed"
        assert await status_of(deployment, second.elicitation_id) is ElicitationStatus.CONSENTED
        forged = await browser.client.post(
            deployment.base_url + "/connect/" + secrets.token_urlsafe(24),
            data={"csrf": form_csrf, "action": "continue"},
        )
        assert forged.status_code in (403, 404) and "x-connector-error" in forged.headers


# --- provider answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "shown"),
    [("server_error", "server_error"), ("temporarily_unavailable", "temporarily_unavailable"), ("<b>x</b>", None)],
)
async def test_provider_error_is_shown_recorded_and_fails_the_elicitation(
    deployment: Deployment, error: str, shown: str | None
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        answer = await answer_to(browser, with_query(callback, code=None, error=error))
        assert answer.status_code == 400
        assert answer.headers["x-connector-error"] == "provider_error"
        expected = shown or "unrecognised_error"
        assert expected in answer.text
        assert "<b>x</b>" not in answer.text
        outcome = await pending.outcome()
    assert outcome.status.value == "failed" and expected in (outcome.reason or "")
    assert deployment.provider.token_requests == []
    await assert_nothing_stored(deployment, pending)
    audit = await deployment.connector.runtime.store.audit.list(elicitation_id=pending.elicitation_id)
    errors = [e for e in audit if e.event == "provider_error"]
    assert len(errors) == 1 and errors[0].detail["error"] == expected
    assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.FAILED


async def test_answer_at_another_providers_callback_is_refused(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        mixed_up = callback.replace("/callback/github", "/callback/google")
        answer = await answer_to(browser, mixed_up)
        assert answer.status_code == 400 and answer.headers["x-connector-error"] == "provider_mismatch"
        assert deployment.provider.token_requests == []
        await assert_nothing_stored(deployment, pending)
        assert "provider_mismatch" in await events(deployment, pending.elicitation_id)


async def test_code_exchange_failure_is_a_recorded_provider_error(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await to_callback(browser, pending.url)
        answer = await answer_to(browser, with_query(callback, code="mock_code_forged"))
        assert answer.status_code == 502 and answer.headers["x-connector-error"] == "provider_token_error"
        outcome = await pending.outcome()
    assert outcome.status.value == "failed"
    await assert_nothing_stored(deployment, pending)
    assert "provider_error" in await events(deployment, pending.elicitation_id)


# --- HTTPS everywhere except loopback ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://connector.example.com", False),
        ("http://10.0.0.5:8700", False),
        ("https://connector.example.com", True),
        ("http://127.0.0.1:8700", True),
        ("http://localhost:8700", True),
        ("http://[::1]:8700", True),
    ],
)
def test_public_base_url_must_be_https_unless_loopback(tmp_path: Path, url: str, ok: bool) -> None:
    config = tmp_path / "connector.toml"
    config.write_text("")
    if ok:
        assert load_settings(config, env={"CONNECTOR_PUBLIC_BASE_URL": url}).public_base_url == url
        return
    with pytest.raises(ConfigError) as caught:
        load_settings(config, env={"CONNECTOR_PUBLIC_BASE_URL": url})
    assert caught.value.key == "public_base_url" and "https" in caught.value.problem


@pytest.mark.parametrize("key", ["authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri"])
def test_provider_endpoints_must_be_https_unless_loopback(tmp_path: Path, key: str) -> None:
    table = {
        "authorization_endpoint": "https://as.acme.test/authorize",
        "token_endpoint": "https://as.acme.test/token",
        "jwks_uri": "https://as.acme.test/jwks",
        "issuer": "https://as.acme.test",
        "oidc": "true",
    }
    table[key] = "http://as.acme.test/x"
    path = tmp_path / "providers.toml"
    path.write_text("[acme]\n" + "".join(f"{k} = {v if v == 'true' else repr(v)}\n" for k, v in table.items()))
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == f"acme.{key}" and "https" in caught.value.problem
    table[key] = "http://127.0.0.1:9/x"  # loopback: a local test provider
    path.write_text("[acme]\n" + "".join(f"{k} = {v if v == 'true' else repr(v)}\n" for k, v in table.items()))
    assert load_catalog(path, env={}).get("acme").oidc


@pytest.mark.parametrize("missing", ["issuer", "jwks_uri"])
def test_an_openid_provider_needs_an_issuer_and_keys(tmp_path: Path, missing: str) -> None:
    table = {
        "authorization_endpoint": "https://as.acme.test/authorize",
        "token_endpoint": "https://as.acme.test/token",
        "jwks_uri": "https://as.acme.test/jwks",
        "issuer": "https://as.acme.test",
    }
    del table[missing]
    path = tmp_path / "providers.toml"
    path.write_text("[acme]\noidc = true\n" + "".join(f'{k} = "{v}"\n' for k, v in table.items()))
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == f"acme.{missing}"


def test_iss_parameter_support_needs_an_issuer(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(
        '[acme]\nauthorization_endpoint = "https://as.acme.test/a"\ntoken_endpoint = "https://as.acme.test/t"\n'
        "authorization_response_iss_parameter_supported = true\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_catalog(path, env={})
    assert caught.value.key == "acme.issuer"


async def test_discovered_endpoints_must_be_https() -> None:
    discovery = "https://sso.acme.test/.well-known/openid-configuration"
    entry = ProviderEntry(
        name="sso", display_name="SSO", discovery_url=discovery, oidc=True, client_id="c", client_secret=None
    )
    catalog = ProviderCatalog([ProviderEntry(**{**entry.__dict__, "client_secret": _secret()})])
    document = {
        "issuer": "https://sso.acme.test",
        "authorization_endpoint": "https://sso.acme.test/authorize",
        "token_endpoint": "https://sso.acme.test/token",
        "jwks_uri": "http://sso.acme.test/jwks",
    }
    with respx.mock(assert_all_mocked=True) as router:
        router.get(discovery).mock(return_value=httpx.Response(200, json=document))
        gateway = ProviderGateway(catalog)
        try:
            with pytest.raises(ConnectorError) as caught:
                await gateway.resolve("sso")
        finally:
            await gateway.aclose()
    assert "jwks_uri" in str(caught.value) and "https" in str(caught.value)


def _secret():  # type: ignore[no-untyped-def]
    from pydantic import SecretStr

    return SecretStr("s")


async def test_a_provider_client_sends_what_httpx_own_client_sends() -> None:
    """The provider's pooled client hands a request straight to its pool: on the wire it is the request httpx's own
    client sends (headers, body, the client's timeout), the answer is read and closed, no cookie is kept; a call
    that asks to follow redirects (or to stream) goes the client's own way."""
    from service.oauth.http import ProviderHttp

    http = ProviderHttp()
    pooled = http.client("acme")
    plain = httpx.AsyncClient(timeout=http.settings.timeout)
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/moved":
            return httpx.Response(302, headers={"Location": "https://acme.test/token"})
        return httpx.Response(200, json={"ok": True}, headers={"Set-Cookie": "session=a; Path=/"})

    try:
        with respx.mock(assert_all_mocked=True) as router:
            router.route(host="acme.test").mock(side_effect=answer)
            for client in (pooled, plain):
                response = await client.post(
                    "https://acme.test/token", data={"code": "c"}, headers={"Accept": "application/json"}
                )
                assert response.json() == {"ok": True} and response.is_closed
                assert response.request.url == seen[-1].url and response.elapsed.total_seconds() >= 0
            ours, theirs = seen
            assert ours.headers.multi_items() == theirs.headers.multi_items() and ours.content == theirs.content
            assert ours.extensions["timeout"] == theirs.extensions["timeout"]
            assert not list(pooled.cookies.jar)
            assert (await pooled.get("https://acme.test/moved")).status_code == 302
            followed = await pooled.get("https://acme.test/moved", follow_redirects=True)
            assert followed.status_code == 200 and len(followed.history) == 1
            async with pooled.stream("GET", "https://acme.test/token") as streamed:
                assert not streamed.is_closed and (await streamed.aread())
    finally:
        await http.aclose()
        await plain.aclose()


async def test_a_continue_after_the_agent_cancelled_since_its_page_was_shown_is_refused(deployment: Deployment) -> None:
    # The Continue takes the elicitation as its consent page read it (no second read): a cancellation in between
    # is found by the start's conditional update, and the browser is told, not sent to the provider.
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        page = await browser.get(pending.url)
        assert page.status_code == 200
        pending.task.cancel()
        for _ in range(100):
            if await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CANCELLED:
                break
            await asyncio.sleep(0.05)
        answer = await browser.submit(page, "continue")
        assert answer.status_code == 410
        assert answer.headers.get("x-connector-error") == "cancelled"
    assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CANCELLED
    async with deployment.connector.runtime.store.db.reader.connect() as conn:
        flows = await conn.execute(select(oauth_flows).where(oauth_flows.c.elicitation_id == pending.elicitation_id))
        assert flows.all() == []  # no flow started: nothing to take to the provider
