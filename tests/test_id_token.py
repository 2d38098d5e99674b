"""OpenID Connect providers: nonce and full ID-token validation, and the RFC 9207 `iss` check.

The provider is a `MockOIDCProvider` served by a real uvicorn server on loopback: its ID tokens are signed with
a real RSA key, and the connector fetches the public keys from its `/jwks` endpoint over a socket. Each bad
token spoils exactly one thing; each refusal is checked on the page, in the database (nothing stored, the
elicitation failed with the check named), in the audit trail, and for leaks of the token.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from service import ElicitationStatus
from service.oauth import IdTokenError, IdTokenExpectations, JwksCache, ResolvedProvider
from service.oauth.id_token import validate_id_token
from service.oauth.issuer import issuer_matches
from service.providers import ProviderEntry
from service.testing import MockOAuthProvider, ScriptedBrowser
from service.testing.mock_oidc import MockOIDCProvider

from .conftest import Deployment, write_catalog
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
from .identity_support import oidc_provider_key

PROVIDERS = ("oidcmock", "oidcstrict", "oidcdisco")


@pytest.fixture
async def oidc_provider() -> AsyncIterator[MockOIDCProvider]:
    provider = MockOIDCProvider(signing_key=oidc_provider_key())
    async with provider.serve_http():  # a real loopback server: authorize, token, userinfo, jwks, discovery
        yield provider


@pytest.fixture
def connector_env(
    connector_env: dict[str, str],
    oidc_provider: MockOIDCProvider,
    mock_provider: MockOAuthProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    """The usual deployment, plus three entries for the same OpenID provider: endpoints written out (as for
    Google), the same promising RFC 9207 `iss`, and one read from the discovery document (the generic oidc)."""
    write_catalog(
        Path(connector_env["CONNECTOR_PROVIDERS__CATALOG"]),
        {
            "github": mock_provider.catalog_entry(),
            "oidcmock": oidc_provider.catalog_entry(),
            "oidcstrict": {
                **oidc_provider.catalog_entry(),
                "authorization_response_iss_parameter_supported": True,
            },
            "oidcdisco": oidc_provider.discovery_entry(),
        },
    )
    env = dict(connector_env)
    for name in PROVIDERS:
        env[f"CONNECTOR_PROVIDER_{name.upper()}_CLIENT_ID"] = oidc_provider.client_id
        env[f"CONNECTOR_PROVIDER_{name.upper()}_CLIENT_SECRET"] = oidc_provider.client_secret
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _no_leak(deployment: Deployment, provider: MockOIDCProvider, caplog: pytest.LogCaptureFixture, audit: str) -> None:
    logs = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records if r.name.startswith("service"))
    for secret in provider.secrets_issued():
        assert secret not in audit and secret not in logs


# --- the good path -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["oidcmock", "oidcdisco"])
async def test_valid_id_token_completes_and_its_sub_is_the_account(
    deployment: Deployment, oidc_provider: MockOIDCProvider, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider=name, scopes=["email"])
        sent = await to_provider(browser, pending.url)
        query = query_of(sent.headers["location"])
        assert "openid" in query["scope"].split()  # always asked of an OpenID provider
        assert len(query["nonce"]) >= 32
        final = await browser.follow(sent)
        assert final.status_code == 200, final.text
        outcome = await pending.outcome()
    assert outcome.ok
    grants = await deployment.connector.runtime.store.grants.find(deployment.local_user, name)
    assert [g.provider_account_id for g in grants] == ["oidc-user-1"]
    assert oidc_provider.jwks_requests == 1  # fetched over HTTP from the provider's jwks_uri
    audit = json.dumps([(e.event, e.detail) for e in await deployment.connector.runtime.store.audit.list()])
    _no_leak(deployment, oidc_provider, caplog, audit)


# --- bad ID tokens -----------------------------------------------------------------------------------------


def _unsigned(claims: dict[str, Any]) -> str:
    def b64(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."


def _spoil(provider: MockOIDCProvider, how: str) -> None:
    now = int(time.time())
    if how == "wrong_aud":
        provider.id_token_claims = {"aud": "another-client"}
    elif how == "extra_aud_without_azp":
        provider.id_token_claims = {"aud": [provider.client_id, "another-client"]}
    elif how == "wrong_azp":
        provider.id_token_claims = {"azp": "another-client"}
    elif how == "expired":
        provider.id_token_claims = {"exp": now - 3600, "iat": now - 7200}
    elif how == "issued_in_the_future":
        provider.id_token_claims = {"iat": now + 3600, "exp": now + 7200}
    elif how == "bad_signature":  # another key under the published key id
        provider.id_token_signer = RSAKey.generate_key(2048, parameters={"kid": provider.signing_key.kid})
    elif how == "unknown_key":  # a key id the JWKS does not have, even after re-reading it
        provider.id_token_signer = RSAKey.generate_key(2048, parameters={"kid": "attacker-key"})
    elif how == "alg_none":
        provider.id_token_forge = _unsigned
    elif how == "hs256_with_client_secret":
        secret = OctKey.import_key(provider.client_secret.encode())
        provider.id_token_forge = lambda claims: jwt.encode({"alg": "HS256"}, claims, secret)
    elif how == "wrong_nonce":
        provider.id_token_claims = {"nonce": "a-nonce-from-another-request"}
    elif how == "missing_nonce":
        provider.id_token_claims = {"nonce": None}
    elif how == "wrong_iss":
        provider.id_token_claims = {"iss": "https://attacker.example"}
    elif how == "missing_sub":
        provider.id_token_claims = {"sub": None}
    elif how == "missing_exp":
        provider.id_token_claims = {"exp": None}
    elif how == "not_a_jwt":
        provider.id_token_forge = lambda claims: "not-a-jwt"
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "check"),
    [
        ("wrong_aud", "aud"),
        ("extra_aud_without_azp", "azp"),
        ("wrong_azp", "azp"),
        ("expired", "exp"),
        ("issued_in_the_future", "iat"),
        ("bad_signature", "signature"),
        ("unknown_key", "signature"),
        ("alg_none", "signature"),
        ("hs256_with_client_secret", "signature"),
        ("wrong_nonce", "nonce"),
        ("missing_nonce", "nonce"),
        ("wrong_iss", "iss"),
        ("missing_sub", "sub"),
        ("missing_exp", "exp"),
        ("not_a_jwt", "signature"),
    ],
)
async def test_bad_id_token_is_refused_and_nothing_is_stored(
    deployment: Deployment,
    oidc_provider: MockOIDCProvider,
    caplog: pytest.LogCaptureFixture,
    how: str,
    check: str,
) -> None:
    _spoil(oidc_provider, how)
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider="oidcmock", scopes=["email"])
        final = await browser.follow(await to_provider(browser, pending.url))
        assert final.status_code == 502, final.text
        assert final.headers["x-connector-error"] == "invalid_id_token"
        assert f"failed the {check} check" in final.text
        outcome = await pending.outcome()
        assert outcome.status.value == "failed" and check in (outcome.reason or "")
        await assert_nothing_stored(deployment, pending)
    assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.FAILED
    audit = await deployment.connector.runtime.store.audit.list(elicitation_id=pending.elicitation_id)
    refused = [e for e in audit if e.event == "provider_error"]
    assert len(refused) == 1 and refused[0].detail["check"] == check
    assert "completed" not in [e.event for e in audit]
    if how == "unknown_key":
        assert oidc_provider.jwks_requests == 1  # keys read moments ago are not re-read for a stranger's key id
    _no_leak(deployment, oidc_provider, caplog, json.dumps([(e.event, e.detail) for e in audit]))


async def test_rotated_keys_are_read_again(
    deployment: Deployment, oidc_provider: MockOIDCProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = deployment.connector.runtime.providers.jwks
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        first = await ask(provider="oidcmock", scopes=["email"])
        assert (await browser.follow(await to_provider(browser, first.url))).status_code == 200
        assert oidc_provider.jwks_requests == 1
        # A minute later the provider rotates its key: the new key id is unknown, so the keys are read again.
        oidc_provider.signing_key = RSAKey.generate_key(2048, parameters={"kid": "mock-key-2", "use": "sig"})
        later = time.monotonic() + 60
        monkeypatch.setattr(cache, "_clock", lambda: later)
        await deployment.connector.runtime.store.grants.delete(
            (await deployment.connector.runtime.store.grants.find(deployment.local_user, "oidcmock"))[0].id
        )
        second = await ask(provider="oidcmock", scopes=["email"])
        final = await browser.follow(await to_provider(browser, second.url))
        assert final.status_code == 200, final.text
    assert oidc_provider.jwks_requests == 2


async def test_userinfo_naming_another_subject_is_refused(
    deployment: Deployment, oidc_provider: MockOIDCProvider
) -> None:
    oidc_provider.account = {**oidc_provider.account, "sub": "someone-else"}
    oidc_provider.id_token_claims = {"sub": "oidc-user-1"}
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider="oidcmock", scopes=["email"])
        final = await browser.follow(await to_provider(browser, pending.url))
        assert final.status_code == 502 and final.headers["x-connector-error"] == "provider_bad_response"
        await assert_nothing_stored(deployment, pending)
    assert "provider_error" in await events(deployment, pending.elicitation_id)


# --- RFC 9207 `iss` on the authorization response ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "iss", "refused"),
    [
        ("oidcmock", "https://attacker.example", True),  # a mix-up: the answer claims another issuer
        ("oidcmock", None, False),  # not promised by this provider: may be absent
        ("oidcmock", "ISSUER", False),
        ("oidcstrict", None, True),  # promised: a missing `iss` is refused
        ("oidcstrict", "https://attacker.example", True),
        ("oidcstrict", "ISSUER", False),
    ],
)
async def test_iss_parameter_is_checked_before_the_code_is_used(
    deployment: Deployment, oidc_provider: MockOIDCProvider, name: str, iss: str | None, refused: bool
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider=name, scopes=["email"])
        callback = await to_callback(browser, pending.url)
        answer = await answer_to(browser, with_query(callback, iss=oidc_provider.issuer if iss == "ISSUER" else iss))
        if not refused:
            assert answer.status_code == 303, answer.text
            return
        assert answer.status_code == 400
        assert answer.headers["x-connector-error"] == "issuer_mismatch"
        assert oidc_provider.token_requests == []  # the code never reached a token endpoint
        await assert_nothing_stored(deployment, pending)
        audit = await deployment.connector.runtime.store.audit.list(elicitation_id=pending.elicitation_id)
        mismatches = [e for e in audit if e.event == "issuer_mismatch"]
        assert len(mismatches) == 1
        assert mismatches[0].detail["iss"] == ("missing" if iss is None else "unexpected")
        # The elicitation stays open for its user: a fresh start from the same link succeeds.
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.AUTHORIZING
        retry = await to_callback(browser, pending.url)
        done = await browser.get(with_query(retry, iss=oidc_provider.issuer))
        assert done.status_code == 303, done.text


async def test_discovery_advertising_iss_support_makes_iss_required(
    deployment: Deployment, oidc_provider: MockOIDCProvider
) -> None:
    oidc_provider.iss_in_authorization_response = True  # advertised in discovery, and sent
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask(provider="oidcdisco", scopes=["email"])
        callback = await to_callback(browser, pending.url)
        assert query_of(callback)["iss"] == oidc_provider.issuer
        stripped = await answer_to(browser, with_query(callback, iss=None))
        assert stripped.status_code == 400 and stripped.headers["x-connector-error"] == "issuer_mismatch"
        await assert_nothing_stored(deployment, pending)


# --- multi-tenant issuers (Microsoft Entra ID) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("received", "tid", "ok"),
    [
        ("https://login.example.com/9188040d-6c67-4c5b-b112-36a304b66dad/v2.0", None, True),
        (
            "https://login.example.com/9188040d-6c67-4c5b-b112-36a304b66dad/v2.0",
            "9188040d-6c67-4c5b-b112-36a304b66dad",
            True,
        ),
        ("https://login.example.com/9188040d-6c67-4c5b-b112-36a304b66dad/v2.0", "another-tenant", False),
        ("https://login.example.com/a/b/v2.0", None, False),
        ("https://login.example.com//v2.0", None, False),
        ("https://evil.example.com/9188040d/v2.0", None, False),
    ],
)
def test_tenant_issuer_template(received: str, tid: str | None, ok: bool) -> None:
    assert issuer_matches("https://login.example.com/{tenantid}/v2.0", received, tenant_id=tid) is ok
    assert issuer_matches("https://login.example.com/common/v2.0", received) is False


@pytest.mark.parametrize(("tid_claim", "ok"), [("tenant-1", True), ("tenant-2", False), (None, False)])
async def test_tenant_issuer_must_carry_the_tokens_own_tid(
    oidc_provider: MockOIDCProvider, tid_claim: str | None, ok: bool
) -> None:
    import httpx

    template = f"{oidc_provider.base_url}/{{tenantid}}/v2.0"
    entry = ResolvedProvider.from_entry(
        ProviderEntry(
            name="entra",
            display_name="Entra",
            oidc=True,
            issuer=template,
            authorization_endpoint=f"{oidc_provider.base_url}/authorize",
            token_endpoint=f"{oidc_provider.base_url}/token",
            jwks_uri=f"{oidc_provider.base_url}/jwks",
            client_id=oidc_provider.client_id,
        )
    )
    oidc_provider.id_token_claims = {"iss": f"{oidc_provider.base_url}/tenant-1/v2.0", "tid": tid_claim}
    token = oidc_provider.make_id_token(nonce="n-1")
    expect = IdTokenExpectations(issuer=template, nonce="n-1")
    async with httpx.AsyncClient() as http:
        if ok:
            claims = await validate_id_token(entry, token, expect, jwks=JwksCache(), http=http, now=time.time())
            assert claims["sub"] == "oidc-user-1"
            return
        with pytest.raises(IdTokenError) as caught:
            await validate_id_token(entry, token, expect, jwks=JwksCache(), http=http, now=time.time())
        assert caught.value.check == "iss"
