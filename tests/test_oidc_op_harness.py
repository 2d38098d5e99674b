"""The oidc-provider test harness itself, exercised with plain httpx (never the connector's code).

These tests pin down what the independent OP does, so that tests of the connector against it can rely on it:
discovery, authorization code + PKCE S256 with RFC 9207 `iss`, RFC 6749 §2.3.1 client authentication,
offline_access only with prompt=consent, refresh rotation with ID tokens, revocation, narrowed grants, and the
test-only controls (`sub` override, counters).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from joserfc import jwt
from joserfc.jwk import KeySet

from .oidc_op_support import (
    AuthorizationResult,
    OidcClient,
    OidcOp,
    basic_auth_header,
    naive_basic_auth_header,
    pkce_pair,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Secrets with every character that Basic auth without RFC 6749 form-encoding gets wrong.
BASIC_SECRET = "b+s/e=c:r+e/t=="
POST_SECRET = "p+o/s=t:s e&c%r"
CONFIG: dict[str, Any] = {
    "clients": [
        {
            "client_id": "basic-client",
            "client_secret": BASIC_SECRET,
            "token_endpoint_auth_method": "client_secret_basic",
            "redirect_uris": ["http://127.0.0.1:9/callback/basic"],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
        {
            "client_id": "post-client",
            "client_secret": POST_SECRET,
            "token_endpoint_auth_method": "client_secret_post",
            "redirect_uris": ["http://127.0.0.1:9/callback/post"],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
        {
            "client_id": "public-client",
            "token_endpoint_auth_method": "none",
            "redirect_uris": ["http://127.0.0.1:9/callback/public"],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
    ],
    "accounts": {
        "alice": {"email": "alice@example.com", "email_verified": True, "name": "Alice"},
        "bob": {"email": "bob@example.com", "name": "Bob"},
    },
    "login_account": "alice",
    "access_token_ttl": 30,
    "refresh_token_rotation": True,
    "scopes": ["api.read", "api.write", "api.admin"],
    "narrow_scopes": ["api.admin"],
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def op() -> AsyncIterator[OidcOp]:
    async with OidcOp.start(CONFIG) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def token_request(
    op: OidcOp, http: httpx.AsyncClient, client: OidcClient, form: dict[str, str]
) -> httpx.Response:
    headers, data = client.authenticate(form)
    return await http.post(await op.endpoint("token"), data=data, headers=headers)


def code_form(result: AuthorizationResult) -> dict[str, str]:
    assert result.code is not None, result.params
    assert result.code_verifier is not None and result.redirect_uri is not None
    return {
        "grant_type": "authorization_code",
        "code": result.code,
        "redirect_uri": result.redirect_uri,
        "code_verifier": result.code_verifier,
    }


async def tokens_for(op: OidcOp, http: httpx.AsyncClient, client: OidcClient, **authorize: Any) -> dict[str, Any]:
    result = await op.authorize(client, **authorize)
    response = await token_request(op, http, client, code_form(result))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def id_token_claims(op: OidcOp, http: httpx.AsyncClient, id_token: str) -> dict[str, Any]:
    """Verify the ID token's signature against the OP's JWKS and return its claims."""
    jwks = (await http.get(str((await op.discovery())["jwks_uri"]))).json()
    token = jwt.decode(id_token, KeySet.import_key_set(jwks), algorithms=["RS256", "ES256"])
    claims: dict[str, Any] = dict(token.claims)
    return claims


# ----------------------------------------------------------------------------------------------- discovery


async def test_discovery_document(op: OidcOp, http: httpx.AsyncClient) -> None:
    response = await http.get(op.discovery_url)
    assert response.status_code == 200
    meta = response.json()
    assert meta["issuer"] == op.issuer
    assert op.issuer.startswith("http://127.0.0.1:")
    for name in ("authorization", "token", "revocation", "introspection", "userinfo"):
        assert meta[f"{name}_endpoint"].startswith(op.issuer + "/"), name
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert meta["authorization_response_iss_parameter_supported"] is True
    assert {"openid", "offline_access", "api.read", "api.write", "email", "profile"} <= set(meta["scopes_supported"])
    assert {"client_secret_basic", "client_secret_post", "none"} <= set(meta["token_endpoint_auth_methods_supported"])
    assert {"authorization_code", "refresh_token"} <= set(meta["grant_types_supported"])
    assert "code" in meta["response_types_supported"]

    jwks = (await http.get(meta["jwks_uri"])).json()
    assert {(key["kty"], key["alg"]) for key in jwks["keys"]} == {("RSA", "RS256"), ("EC", "ES256")}
    assert all("d" not in key for key in jwks["keys"]), "private key material in the JWKS"


# ------------------------------------------------------------------------------------ authorization + PKCE


async def test_authorization_code_flow_with_pkce_ends_at_the_redirect_uri_with_iss(op: OidcOp) -> None:
    client = op.client("basic-client")
    result = await op.authorize(client, scope="openid api.read", state="state-123")

    assert result.location.startswith(client.redirect_uri + "?")
    assert result.code
    assert result.state == "state-123"
    assert result.iss == op.issuer  # RFC 9207
    # authorization endpoint -> login interaction -> resume -> consent interaction -> resume -> redirect_uri
    assert sum("/interaction/" in hop for hop in result.hops) == 2


async def test_pkce_is_required_and_only_s256(op: OidcOp) -> None:
    client = op.client("basic-client")
    base = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": client.redirect_uri,
        "scope": "openid",
        "state": "s",
    }
    authorization = await op.endpoint("authorization")
    without = await op.follow(f"{authorization}?{httpx.QueryParams(base)}", client.redirect_uri)
    assert without.error == "invalid_request"
    assert without.iss == op.issuer
    assert "PKCE" in without.params["error_description"]

    plain = {**base, "code_challenge": "x" * 43, "code_challenge_method": "plain"}
    refused = await op.follow(f"{authorization}?{httpx.QueryParams(plain)}", client.redirect_uri)
    assert refused.error == "invalid_request"


async def test_code_verifier_is_checked(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("public-client")
    result = await op.authorize(client, scope="openid")
    wrong = await token_request(op, http, client, {**code_form(result), "code_verifier": pkce_pair()[0]})
    assert wrong.status_code == 400
    assert wrong.json()["error"] == "invalid_grant"


# --------------------------------------------------------------------------------------- client auth


async def test_client_secret_basic_needs_rfc6749_form_encoding(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    assert client.client_secret is not None
    assert set("+/=:") <= set(client.client_secret)
    result = await op.authorize(client, scope="openid api.read")
    token_endpoint = await op.endpoint("token")
    form = code_form(result)

    # Plain Basic auth (RFC 7617, no form-encoding): the OP form-decodes the secret ('+' -> ' ') and refuses it.
    naive = naive_basic_auth_header(client.client_id, client.client_secret)
    refused = await http.post(token_endpoint, data=form, headers={"Authorization": naive})
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"] == "invalid_client"

    # RFC 6749 §2.3.1: form-urlencode id and secret, then base64. The code was not spent by the refusal.
    encoded = basic_auth_header(client.client_id, client.client_secret)
    assert encoded != naive
    assert base64.b64decode(encoded.removeprefix("Basic ")).decode() == "basic-client:b%2Bs%2Fe%3Dc%3Ar%2Be%2Ft%3D%3D"
    response = await http.post(token_endpoint, data=form, headers={"Authorization": encoded})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_type"].lower() == "bearer"
    assert body["access_token"]
    assert body["id_token"]
    assert 0 < body["expires_in"] <= 30  # access_token_ttl
    assert set(body["scope"].split()) == {"openid", "api.read"}
    assert "refresh_token" not in body  # no offline_access asked


async def test_client_secret_post(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("post-client")
    assert client.client_secret is not None
    token_endpoint = await op.endpoint("token")
    result = await op.authorize(client, scope="openid")
    form = code_form(result)

    wrong = await http.post(
        token_endpoint, data={**form, "client_id": client.client_id, "client_secret": client.client_secret[:-1]}
    )
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "invalid_client"
    # The secret goes into the form body as-is; the form encoding (done by httpx) carries '+', '&', '%', ' '.
    response = await http.post(
        token_endpoint, data={**form, "client_id": client.client_id, "client_secret": client.client_secret}
    )
    assert response.status_code == 200, response.text
    assert response.json()["id_token"]


# --------------------------------------------------------------------------------- refresh tokens


async def test_offline_access_only_with_prompt_consent(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    silent = await tokens_for(op, http, client, scope="openid offline_access api.read")
    assert "refresh_token" not in silent
    assert "offline_access" not in silent["scope"].split()

    consented = await tokens_for(op, http, client, scope="openid offline_access api.read", prompt="consent")
    assert consented["refresh_token"]
    assert "offline_access" in consented["scope"].split()


async def test_refresh_rotates_and_returns_an_id_token(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    first = await tokens_for(op, http, client, scope="openid offline_access api.read", prompt="consent")
    response = await token_request(
        op, http, client, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
    )
    assert response.status_code == 200, response.text
    second = response.json()
    assert second["access_token"] != first["access_token"]
    assert second["refresh_token"] != first["refresh_token"]  # rotated
    assert set(second["scope"].split()) == {"openid", "offline_access", "api.read"}
    claims = await id_token_claims(op, http, second["id_token"])
    assert claims["sub"] == "alice"
    assert claims["iss"] == op.issuer
    assert claims["aud"] == client.client_id

    # The rotated-out token is spent; presenting it again revokes the whole grant (reuse detection).
    reuse = await token_request(
        op, http, client, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
    )
    assert reuse.status_code == 400
    assert reuse.json()["error"] == "invalid_grant"
    assert (await op.introspect(second["refresh_token"]))["active"] is False


async def test_sub_override_changes_the_sub_of_the_next_refresh_only(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    tokens = await tokens_for(op, http, client, scope="openid offline_access", prompt="consent")
    assert (await id_token_claims(op, http, tokens["id_token"]))["sub"] == "alice"

    await op.override_sub("mallory", client_id=client.client_id)
    overridden = await token_request(
        op, http, client, {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}
    )
    assert overridden.status_code == 200, overridden.text
    assert (await id_token_claims(op, http, overridden.json()["id_token"]))["sub"] == "mallory"

    again = await token_request(
        op, http, client, {"grant_type": "refresh_token", "refresh_token": overridden.json()["refresh_token"]}
    )
    assert again.status_code == 200, again.text
    assert (await id_token_claims(op, http, again.json()["id_token"]))["sub"] == "alice"


# ------------------------------------------------------------------------------- revocation, introspection


async def test_revocation_makes_introspection_inactive(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    tokens = await tokens_for(op, http, client, scope="openid offline_access api.read", prompt="consent")
    access = await op.introspect(tokens["access_token"])
    assert access["active"] is True
    assert access["sub"] == "alice"
    assert access["client_id"] == client.client_id
    assert set(access["scope"].split()) == {"openid", "offline_access", "api.read"}
    assert (await op.introspect(tokens["refresh_token"]))["active"] is True

    headers, data = client.authenticate({"token": tokens["refresh_token"], "token_type_hint": "refresh_token"})
    revoked = await http.post(await op.endpoint("revocation"), data=data, headers=headers)
    assert revoked.status_code == 200, revoked.text

    assert (await op.introspect(tokens["refresh_token"]))["active"] is False
    # Revoking a refresh token revokes its grant, and with it the access token (oidc-provider's default policy).
    assert (await op.introspect(tokens["access_token"]))["active"] is False
    refresh = await token_request(
        op, http, client, {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}
    )
    assert refresh.json()["error"] == "invalid_grant"


async def test_revoking_the_access_token_also_ends_the_refresh_token(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("post-client")
    tokens = await tokens_for(op, http, client, scope="openid offline_access", prompt="consent")
    headers, data = client.authenticate({"token": tokens["access_token"], "token_type_hint": "access_token"})
    assert (await http.post(await op.endpoint("revocation"), data=data, headers=headers)).status_code == 200
    # RFC 7009 §2.1 allows it and oidc-provider does it: every token of the grant goes.
    assert (await op.introspect(tokens["access_token"]))["active"] is False
    assert (await op.introspect(tokens["refresh_token"]))["active"] is False
    # An unknown token is "revoked" too (200), as RFC 7009 §2.2 says.
    headers, data = client.authenticate({"token": "no-such-token"})
    assert (await http.post(await op.endpoint("revocation"), data=data, headers=headers)).status_code == 200


# ---------------------------------------------------------------------------------- interaction controls


async def test_narrow_scopes_give_a_narrowed_grant(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    # From the configuration: api.admin is always refused.
    configured = await tokens_for(op, http, client, scope="openid api.read api.admin")
    assert set(configured["scope"].split()) == {"openid", "api.read"}

    await op.set_narrow_scopes(["api.write"])
    try:
        narrowed = await tokens_for(op, http, client, scope="openid api.read api.write")
    finally:
        await op.set_narrow_scopes(CONFIG["narrow_scopes"])
    assert set(narrowed["scope"].split()) == {"openid", "api.read"}
    assert set((await op.introspect(narrowed["access_token"]))["scope"].split()) == {"openid", "api.read"}

    full = await tokens_for(op, http, client, scope="openid api.read api.write")
    assert set(full["scope"].split()) == {"openid", "api.read", "api.write"}


async def test_login_hint_and_deny_next(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("basic-client")
    bob = await tokens_for(op, http, client, scope="openid", extra={"login_hint": "bob"})
    assert (await id_token_claims(op, http, bob["id_token"]))["sub"] == "bob"

    await op.deny_next("access_denied", "the user said no")
    denied = await op.authorize(client, scope="openid", state="st")
    assert denied.error == "access_denied"
    assert denied.params["error_description"] == "the user said no"
    assert denied.state == "st"
    assert denied.iss == op.issuer
    assert denied.code is None


async def test_userinfo_returns_the_account_claims(op: OidcOp, http: httpx.AsyncClient) -> None:
    tokens = await tokens_for(op, http, op.client("basic-client"), scope="openid email")
    response = await http.get(
        await op.endpoint("userinfo"), headers={"Authorization": f"Bearer {tokens['access_token']}"}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"sub": "alice", "email": "alice@example.com", "email_verified": True}


# ------------------------------------------------------------------------------------------------ counters


async def test_stats_count_token_requests_and_revocations(op: OidcOp, http: httpx.AsyncClient) -> None:
    client = op.client("post-client")
    await op.reset_stats()
    tokens = await tokens_for(op, http, client, scope="openid offline_access", prompt="consent")
    refresh_token = tokens["refresh_token"]
    for _ in range(2):
        response = await token_request(
            op, http, client, {"grant_type": "refresh_token", "refresh_token": refresh_token}
        )
        refresh_token = response.json()["refresh_token"]
    bad = await token_request(op, http, client, {"grant_type": "refresh_token", "refresh_token": "nope"})
    assert bad.status_code == 400
    headers, data = client.authenticate({"token": refresh_token})
    assert (await http.post(await op.endpoint("revocation"), data=data, headers=headers)).status_code == 200

    stats = await op.stats()
    assert stats["token_requests"] == {"authorization_code": 1, "refresh_token": 3}
    assert stats["token_errors"] == {"refresh_token": {"invalid_grant": 1}}
    assert stats["revocation_requests"] == 1
    assert stats["revocations"] == 1
    assert stats["authorization_requests"] == 1


# ------------------------------------------------------------------------------------------- the harness


async def test_a_bad_configuration_fails_fast_with_the_op_stderr() -> None:
    with pytest.raises(RuntimeError, match="unknown configuration key"):
        async with OidcOp.start({**CONFIG, "no_such_option": 1}):
            pass
