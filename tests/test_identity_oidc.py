"""The `oidc` verifier against a real IdP on a second loopback server: real RSA keys, a real JWKS endpoint."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from joserfc.jwk import RSAKey
from sqlalchemy import select

from service import Connector, load_settings
from service.core.errors import ConfigError
from service.testing import ScriptedBrowser

from .conftest import Deploy, Deployment
from .identity_support import (
    CLIENT_ID,
    LoopbackIdP,
    assert_nothing_happened,
    events,
    identity_verifications,
    last_event,
    page_reveals_no_identity,
    serve_idp,
    started,
)


@pytest.fixture
async def idp() -> AsyncIterator[LoopbackIdP]:
    async with serve_idp(LoopbackIdP()) as served:
        yield served


def oidc_env(idp: LoopbackIdP, **extra: str) -> dict[str, str]:
    return {
        "CONNECTOR_IDENTITY__VERIFIER": "oidc",
        "CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL": idp.discovery_url,
        "CONNECTOR_IDENTITY__OIDC__CLIENT_ID": CLIENT_ID,
        **extra,
    }


@pytest.fixture
async def sso(
    idp: LoopbackIdP,
    deploy_with: Deploy,
) -> AsyncIterator[Deployment]:
    alice = idp.identity("alice")
    async with deploy_with(alice, **oidc_env(idp)) as deployment:
        yield deployment


async def to_idp(browser: ScriptedBrowser, connect_url: str) -> httpx.Response:
    """Open the link, press Continue: the answer redirects to the IdP."""
    page = await browser.get(connect_url)
    assert page.status_code == 200, page.text
    return await browser.submit(page, "continue")


async def idp_answer(browser: ScriptedBrowser, to_idp_response: httpx.Response) -> str:
    """Let the IdP sign the browser in; return the callback URL it sends the browser back to (not yet opened)."""
    at_idp = await browser.get(to_idp_response.headers["location"])
    assert at_idp.status_code == 302, at_idp.text
    return at_idp.headers["location"]


async def test_alice_signs_in_and_completes(sso: Deployment, idp: LoopbackIdP, captured_logs: Any) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        async with ScriptedBrowser() as browser:
            page = await browser.get(pending.url)
            # The consent form may redirect to the IdP (form-action covers the redirect after submit).
            assert idp.base_url in page.headers["content-security-policy"]
            # ... and the page says so: the user first confirms who they are at the IdP's host.
            assert "First, you confirm who you are at" in page.text
            assert f'<span class="host">{urlsplit(idp.base_url).hostname}</span>' in page.text
            leaving = await browser.submit(page, "continue")
            assert leaving.status_code == 303
            assert leaving.headers["location"].startswith(f"{idp.base_url}/authorize?")
            final = await browser.follow(leaving, limit=6)
            # What our server answered (the IdP's own redirect carries its code by design).
            transcript = "\n".join(
                f"{r.status_code}\n{r.headers}\n{r.text}"
                for r in browser.responses
                if str(r.request.url).startswith(sso.base_url)
            )
        assert final.status_code == 200, final.text
        assert "is connected" in final.text

        request = idp.authorize_requests[0]
        assert request["response_type"] == "code" and request["client_id"] == CLIENT_ID
        assert request["code_challenge_method"] == "S256" and request["nonce"] and request["state"]
        assert request["redirect_uri"] == f"{sso.base_url}/identity/oidc/callback"
        assert "openid" in request["scope"].split()
        assert len(await sso.connector.runtime.store.grants.find(alice, "github")) == 1
        trail = await events(sso, pending.elicitation_id)
        assert trail.index("identity_challenge") < trail.index("verified") < trail.index("completed")

        # The PKCE verifier was stored encrypted; state and nonce left only as hashes or inside the row.
        async with sso.connector.runtime.store.engine.connect() as conn:
            rows = (await conn.execute(select(identity_verifications))).mappings().all()
        assert len(rows) == 1 and rows[0]["used_at"] is not None
        verifier = idp.token_requests[0]["code_verifier"]
        assert verifier.encode() not in rows[0]["pkce_ciphertext"]
        assert rows[0]["handle_hash"] != request["state"]
        # No IdP secret (code, verifier, ID token) in any page, log line or audit detail.
        audit = json.dumps([(e.event, e.detail) for e in await sso.connector.runtime.store.audit.list()])
        # httpx/httpcore lines are left out: the test browser shares them, and it carries the IdP's code by design.
        logs = "\n".join(r.getMessage() for r in captured_logs.records if not r.name.startswith(("httpx", "httpcore")))
        for secret in idp.secrets_seen():
            assert secret not in transcript and secret not in audit and secret not in logs


async def test_phishing_bob_signed_in_at_the_idp_is_refused(sso: Deployment, idp: LoopbackIdP) -> None:
    alice, bob = idp.identity("alice"), idp.identity("bob")
    async with started(sso, alice) as pending:
        idp.logged_in = "bob"
        async with ScriptedBrowser() as browser:
            callback = await idp_answer(browser, await to_idp(browser, pending.url))
            refused = await browser.get(callback)
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "identity_mismatch"
        assert "started by a different account" in refused.text
        assert page_reveals_no_identity(refused.text, alice, bob)
        await assert_nothing_happened(sso, pending)
        event = await last_event(sso, "identity_mismatch")
        assert event.elicitation_id == pending.elicitation_id
        assert (event.detail["browser_issuer"], event.detail["browser_subject"]) == (idp.issuer, "bob")

        # Still open for Alice, in her own browser.
        idp.logged_in = "alice"
        async with ScriptedBrowser() as browser:
            final = await browser.authorize(pending.url)
        assert final.status_code == 200, final.text
        assert len(await sso.connector.runtime.store.grants.find(alice, "github")) == 1


def _other_key() -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": "idp-key-1", "alg": "RS256"})  # same kid, other key


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        ({"claims": {"aud": "some-other-client"}}, "aud"),
        ({"claims": {"aud": ["some-other-client", "another"]}}, "aud"),
        ({"claims": {"aud": [CLIENT_ID, "another"]}}, "azp"),  # several audiences and no azp
        ({"claims": {"azp": "some-other-client"}}, "azp"),
        ({"claims": {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}}, "exp"),
        ({"claims": {"iat": int(time.time()) + 3600}}, "iat"),  # issued in the future
        ({"claims": {"iat": int(time.time()) - 3600}}, "iat"),  # issued before this sign-in began
        ({"claims": {"nonce": "not-the-nonce-we-sent"}}, "nonce"),
        ({"claims": {"nonce": None}}, "nonce"),
        ({"claims": {"iss": "https://evil.example"}}, "iss"),
        ({"claims": {"sub": None}}, "sub"),
        ({"signer": _other_key()}, "signature"),
        ({"header": {"kid": "unknown-kid"}}, "signature"),  # a key id the JWKS does not have, even re-read
    ],
    ids=[
        "wrong-aud",
        "aud-list-without-us",
        "several-aud-no-azp",
        "wrong-azp",
        "expired",
        "iat-in-future",
        "iat-before-start",
        "wrong-nonce",
        "no-nonce",
        "wrong-issuer",
        "no-sub",
        "bad-signature",
        "unknown-kid",
    ],
)
async def test_bad_id_tokens_are_refused(sso: Deployment, idp: LoopbackIdP, spoil: dict[str, Any], reason: str) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        idp.claims = spoil.get("claims", {})
        idp.signer = spoil.get("signer")
        idp.header = spoil.get("header", {})
        async with ScriptedBrowser() as browser:
            refused = await browser.get(await idp_answer(browser, await to_idp(browser, pending.url)))
        assert refused.status_code == 403, refused.text
        assert refused.headers["X-Connector-Error"] == "id_token_invalid"
        await assert_nothing_happened(sso, pending)
        event = await last_event(sso, "id_token_invalid")
        assert event.elicitation_id == pending.elicitation_id and event.detail["reason"] == reason
        assert "verified" not in await events(sso, pending.elicitation_id)
        assert len(idp.token_requests) == 1  # the token really was fetched and checked


async def test_unsigned_id_token_is_refused(sso: Deployment, idp: LoopbackIdP) -> None:
    """alg=none: a token anyone could write."""
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        idp.unsigned = True
        async with ScriptedBrowser() as browser:
            refused = await browser.get(await idp_answer(browser, await to_idp(browser, pending.url)))
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "id_token_invalid"
        await assert_nothing_happened(sso, pending)
        assert (await last_event(sso, "id_token_invalid")).detail["reason"] == "signature"


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        ((500, "oops"), "idp_token_error"),
        ((200, "not json"), "idp_token_error"),
        ((400, '{"error": "invalid_grant"}'), "idp_token_error"),
        ((200, '{"access_token": "x", "token_type": "Bearer"}'), "id_token_invalid"),  # no id_token
    ],
    ids=["http-500", "not-json", "oauth-error", "no-id-token"],
)
async def test_a_broken_token_answer_is_refused(
    sso: Deployment, idp: LoopbackIdP, answer: tuple[int, str], code: str
) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        idp.token_answer = answer
        async with ScriptedBrowser() as browser:
            refused = await browser.get(await idp_answer(browser, await to_idp(browser, pending.url)))
        assert refused.status_code in (403, 502), refused.text
        assert refused.headers["X-Connector-Error"] == code
        await assert_nothing_happened(sso, pending)


async def test_the_callback_cannot_be_replayed(sso: Deployment, idp: LoopbackIdP) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        async with ScriptedBrowser() as browser:
            callback = await idp_answer(browser, await to_idp(browser, pending.url))
            first = await browser.get(callback)
            assert first.status_code == 303  # on to the provider
            again = await browser.get(callback)
        assert again.status_code == 400
        assert again.headers["X-Connector-Error"] == "verification_used"
        assert (await last_event(sso, "replay_attempt")).elicitation_id == pending.elicitation_id
        assert len(idp.token_requests) == 1  # the code was not exchanged twice


async def test_the_callback_on_another_browser_is_refused_and_not_consumed(sso: Deployment, idp: LoopbackIdP) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        async with ScriptedBrowser() as browser:
            callback = await idp_answer(browser, await to_idp(browser, pending.url))
            async with ScriptedBrowser() as other:
                await other.get(pending.url)  # a browser with its own binding cookie
                refused = await other.get(callback)
            assert refused.status_code == 403
            assert refused.headers["X-Connector-Error"] == "browser_mismatch"
            await assert_nothing_happened(sso, pending)
            assert (await last_event(sso, "browser_mismatch")).elicitation_id == pending.elicitation_id
            assert idp.token_requests == []  # the code was never exchanged for the wrong browser

            final = await browser.follow(await browser.get(callback))  # the rightful browser still finishes
        assert final.status_code == 200, final.text


async def test_unknown_or_missing_state_is_refused(sso: Deployment, idp: LoopbackIdP) -> None:
    async with ScriptedBrowser() as browser:
        for query in ("?code=x&state=forged-state-value", "?code=x", ""):
            refused = await browser.get(f"{sso.base_url}/identity/oidc/callback{query}")
            assert refused.status_code == 400
            assert refused.headers["X-Connector-Error"] == "unknown_verification"
    assert (await events(sso)).count("unknown_verification") == 3
    assert idp.token_requests == []


async def test_idp_error_is_shown_and_the_link_stays_open(sso: Deployment, idp: LoopbackIdP) -> None:
    alice = idp.identity("alice")
    async with started(sso, alice) as pending:
        idp.deny = "access_denied"
        async with ScriptedBrowser() as browser:
            refused = await browser.get(await idp_answer(browser, await to_idp(browser, pending.url)))
        assert refused.status_code == 403
        assert refused.headers["X-Connector-Error"] == "sign_in_failed"
        assert "access_denied" in refused.text
        await assert_nothing_happened(sso, pending)
        event = await last_event(sso, "idp_error")
        assert event.detail["error"] == "access_denied"


@pytest.mark.parametrize("sent_iss", [None, "https://evil.example"], ids=["right-iss", "wrong-iss"])
async def test_rfc9207_iss_on_the_sign_in_response_is_checked(
    deploy_with: Deploy,
    sent_iss: str | None,
) -> None:
    async with serve_idp(LoopbackIdP(send_iss=True, iss_override=sent_iss)) as idp:
        alice = idp.identity("alice")
        async with deploy_with(alice, **oidc_env(idp)) as sso:
            async with started(sso, alice) as pending:
                async with ScriptedBrowser() as browser:
                    callback = await idp_answer(browser, await to_idp(browser, pending.url))
                    assert "iss=" in callback
                    answer = await browser.get(callback)
                if sent_iss is None:
                    assert answer.status_code == 303, answer.text  # on to the provider
                    return
                assert answer.status_code == 400
                assert answer.headers["X-Connector-Error"] == "issuer_mismatch"
                await assert_nothing_happened(sso, pending)
                assert idp.token_requests == []
                assert "idp_issuer_mismatch" in await events(sso, pending.elicitation_id)


async def test_a_confidential_client_authenticates_at_the_token_endpoint(
    deploy_with: Deploy,
) -> None:
    async with serve_idp(LoopbackIdP(client_secret="idp-client-secret")) as idp:
        alice = idp.identity("alice")
        env = oidc_env(idp, CONNECTOR_IDENTITY__OIDC__CLIENT_SECRET="idp-client-secret")
        async with deploy_with(alice, **env) as deployment:
            async with started(deployment, alice) as pending:
                async with ScriptedBrowser() as browser:
                    final = await browser.follow(await to_idp(browser, pending.url), limit=6)
                assert final.status_code == 200, final.text
                assert "client_secret" not in idp.token_requests[0]  # sent as HTTP Basic, not in the form


async def test_an_unreachable_idp_is_a_clear_503(
    deploy_with: Deploy,
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    env = {
        "CONNECTOR_IDENTITY__VERIFIER": "oidc",
        "CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL": f"{dead}/.well-known/openid-configuration",
        "CONNECTOR_IDENTITY__OIDC__CLIENT_ID": CLIENT_ID,
    }
    user = LoopbackIdP(base_url=dead).identity("alice")
    async with deploy_with(user, **env) as deployment:
        async with started(deployment, user) as pending:
            async with ScriptedBrowser() as browser:
                refused = await to_idp(browser, pending.url)
            assert refused.status_code == 503
            assert refused.headers["X-Connector-Error"] == "idp_unavailable"
            await assert_nothing_happened(deployment, pending)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL": ""}, "identity.oidc.discovery_url"),
        ({"CONNECTOR_IDENTITY__OIDC__CLIENT_ID": ""}, "identity.oidc.client_id"),
    ],
)
def test_incomplete_settings_are_refused(
    tmp_path: Path, connector_env: dict[str, str], overrides: dict[str, str], key: str
) -> None:
    env = {
        **connector_env,
        "CONNECTOR_IDENTITY__VERIFIER": "oidc",
        "CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL": "https://login.example.com/.well-known/openid-configuration",
        "CONNECTOR_IDENTITY__OIDC__CLIENT_ID": CLIENT_ID,
    }
    for name, value in overrides.items():
        if not value:
            env.pop(name)
    config_file = tmp_path / "connector.toml"
    config_file.write_text("")
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(load_settings(config_file, env=env))
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[identity.oidc]\nclient_secret = "s3cret"\n', "identity.oidc.client_secret"),
        (
            '[identity.oidc]\ndiscovery_url = "http://login.example.com/.well-known/openid-configuration"\n',
            "identity.oidc.discovery_url",
        ),
    ],
)
def test_the_file_refuses_secrets_and_plain_http(
    tmp_path: Path, connector_env: dict[str, str], text: str, key: str
) -> None:
    config_file = tmp_path / "connector.toml"
    config_file.write_text('[identity]\nverifier = "oidc"\n' + text)
    with pytest.raises(ConfigError) as caught:
        Connector.from_settings(load_settings(config_file, env=connector_env))
    assert caught.value.key == key
    assert "s3cret" not in str(caught.value)
