"""A FAPI 2.0-grade client against panva's `oidc-provider` (OpenID Certified, its own Node process), configured one
way per module fixture: `private_key_jwt` as the only client authentication (with our public keys pasted from
`acp-connector keys jwks`, or fetched from the connector's `/.well-known/jwks.json`), PAR required.

Each configuration runs the whole flow through the connector's real browser flow and a real ACP connection: the
`oidc` identity verifier's sign-in, the provider's consent, an API call, a refresh, and the revocation at
disconnect. No request is refused at the provider, and no private key or client assertion is found in the logs,
the pages, the ACP wire, the API answers or the database file.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
import pytest_asyncio
import respx
import uvicorn
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from joserfc.jwt import JWTClaimsRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service import AuthorizationOutcome, AuthorizationStatus, Identity
from service.core.errors import ConfigError, DiscoveryError
from service.oauth import ClientKeys, ProviderGateway, choose_auth_method
from service.oauth.check import check_provider
from service.testing import MockOIDCProvider, ScriptedBrowser
from service.vault import KeyRing, Vault, generate_key

from .api_support import api_client, make_key
from .conftest import Deployment, deploy, write_catalog
from .oidc_op_support import OidcOp
from .test_conformant_provider import Agent, Conformant, agent_of, expire, stored_tokens, userinfo
from .test_providers import DISCOVERY, ISSUER, discovery_document, oidc_catalog

NAME = "sso"
VAULT_KEY = generate_key("fapi-1")  # the connector's vault key for the module: its derived client key is pasted
SCOPES = ["openid", "offline_access", "api.read"]
ROOT = Path(__file__).resolve().parent.parent


def cli_jwks(port: int, tmp_path: Path) -> dict[str, Any]:
    """`acp-connector keys jwks`, run as an operator would, with the vault key in the environment."""
    config = tmp_path / "cli.toml"
    config.write_text("# from the environment\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")},
        "CONNECTOR_CONFIG": str(config),
        "CONNECTOR_VAULT__KEYS": VAULT_KEY,
        "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "keys", "jwks"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    jwks: dict[str, Any] = json.loads(done.stdout)
    assert all("d" not in key for key in jwks["keys"]), "a private key member was printed"
    return jwks


@pytest.fixture(scope="module")
def connector_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def loopback_socket(connector_port: int) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", connector_port))
    yield sock
    sock.close()


def op_config(port: int, jwks: dict[str, Any], conn: dict[str, Any], **options: Any) -> dict[str, Any]:
    """Two private_key_jwt clients: the provider connection's, with our public keys pasted (`jwks`), and the
    identity verifier's, whose keys the OP fetches from the connector's JWKS URL."""
    base = f"http://127.0.0.1:{port}"
    common = {
        "token_endpoint_auth_method": "private_key_jwt",
        "token_endpoint_auth_signing_alg": "ES256",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
    }
    return {
        "clients": [
            {"client_id": "conn", "jwks": jwks, "redirect_uris": [f"{base}/callback/{NAME}"], **common, **conn},
            {
                "client_id": "idp",
                "jwks_uri": f"{base}/.well-known/jwks.json",
                "redirect_uris": [f"{base}/identity/oidc/callback"],
                **common,
            },
        ],
        "accounts": {"alice": {"email": "alice@example.com", "email_verified": True}},
        "login_account": "alice",
        "access_token_ttl": 30,
        "refresh_token_rotation": True,
        # Our clients are registered for private_key_jwt alone (the OP refuses any other method for them);
        # client_secret_basic stays enabled only for the harness's own introspection client.
        "client_auth_methods": ["private_key_jwt", "client_secret_basic"],
        "loopback_fetch": True,  # the identity verifier's client keys are at the connector's JWKS URL
        **options,
    }


@dataclass(frozen=True)
class Configuration:
    op: dict[str, Any] = field(default_factory=dict)  # the OP's options (tests/oidc_op/README.md)
    conn: dict[str, Any] = field(default_factory=dict)  # more metadata of the provider connection's client
    entry: dict[str, Any] = field(default_factory=dict)  # more keys of the connector's catalog entry


CONFIGURATIONS = {
    "private_key_jwt": Configuration(),
    "par_required": Configuration(op={"par": {"required": True}}),
    # The client must use DPoP (dpop_bound_access_tokens), every proof with the OP's nonce; the entry asks for DPoP.
    "dpop_required": Configuration(
        op={"dpop": {"require_nonce": True}}, conn={"dpop_bound_access_tokens": True}, entry={"dpop": True}
    ),
    # The OP's FAPI 2.0 profile, PAR required, DPoP-bound tokens with nonces; the entry's one switch: fapi2.
    "fapi2": Configuration(
        op={"fapi": "2.0", "par": {"required": True}, "dpop": {"require_nonce": True}},
        conn={"dpop_bound_access_tokens": True},
        entry={"fapi2": True},
    ),
}


with socket.socket() as _probe:  # the resource server's port: the OP's configuration names it
    _probe.bind(("127.0.0.1", 0))
    RESOURCE = f"http://127.0.0.1:{_probe.getsockname()[1]}/"
CONFIGURATIONS["resource_indicators"] = Configuration(
    op={"resources": {RESOURCE: "api.read api.write"}}, entry={"resource": [RESOURCE], "api_base_url": RESOURCE}
)
PAR = {"par_required", "fapi2"}  # the configurations where the provider requires PAR
DPOP = {"dpop_required", "fapi2"}  # and those where it binds tokens with DPoP, nonces on


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=list(CONFIGURATIONS))
async def oidc_op(
    request: pytest.FixtureRequest, connector_port: int, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[OidcOp]:
    jwks = cli_jwks(connector_port, tmp_path_factory.mktemp("cli"))
    configuration = CONFIGURATIONS[request.param]
    async with OidcOp.start(op_config(connector_port, jwks, configuration.conn, **configuration.op)) as op:
        op.configuration = request.param  # type: ignore[attr-defined]
        if "resources" not in configuration.op:
            yield op
            return
        # In a thread of its own: a server on this module-scoped loop would not run while a test's loop does.
        port = int(RESOURCE.rsplit(":", 1)[1].strip("/"))
        jwks_uri = (await op.discovery())["jwks_uri"]
        server = uvicorn.Server(
            uvicorn.Config(resource_server(op.issuer, jwks_uri), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            yield op
        finally:
            server.should_exit = True
            await asyncio.to_thread(thread.join, 10)


def resource_server(issuer: str, jwks_uri: str) -> Starlette:
    """The API at RESOURCE, as a resource server checks a JWT access token (RFC 9068): the OP's signature, its
    issuer, the audience RESOURCE, not expired. GET /me answers the token's `sub`."""

    async def me(request: Request) -> Response:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        async with httpx.AsyncClient() as http:
            keys = KeySet.import_key_set((await http.get(jwks_uri)).json())
        try:
            claims = jwt.decode(token, keys, algorithms=["ES256"]).claims
            JWTClaimsRegistry(
                iss={"essential": True, "value": issuer}, aud={"essential": True, "value": RESOURCE}
            ).validate(claims)
        except (JoseError, ValueError):
            return JSONResponse({"error": "invalid_token"}, 401)
        if scheme != "Bearer":
            return JSONResponse({"error": "invalid_token"}, 401)
        return JSONResponse({"sub": claims["sub"], "scope": claims.get("scope")})

    return Starlette(routes=[Route("/me", me)])


@pytest_asyncio.fixture
async def provider(oidc_op: OidcOp) -> Conformant:
    await oidc_op.reset_stats()
    discovery = await oidc_op.discovery()
    # The API the grant is used at: the OP's userinfo endpoint, or the resource server the token is for.
    api = f"{RESOURCE}me" if oidc_op.configuration == "resource_indicators" else discovery["userinfo_endpoint"]  # type: ignore[attr-defined]
    return Conformant("oidc-provider", oidc_op.discovery_url, oidc_op.issuer, "alice", api, op=oidc_op)


@asynccontextmanager
async def connector(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, sock: socket.socket, **entry: Any
) -> AsyncIterator[Deployment]:
    """A connector that knows the provider by its discovery URL, has no client secret for it or for the identity
    provider, and signs with the module's vault key."""
    configured = CONFIGURATIONS[provider.op.configuration].entry  # type: ignore[union-attr]
    table = {"discovery_url": provider.discovery_url, "oidc": True, "account_id_field": "sub", **configured, **entry}
    catalog = write_catalog(tmp_path / "fapi.toml", {NAME: {"api_base_url": provider.issuer, **table}})
    env = {
        "CONNECTOR_VAULT__KEYS": VAULT_KEY,
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_PROVIDER_SSO_CLIENT_ID": "conn",
        "CONNECTOR_PROVIDERS__SSO__TOKEN_ENDPOINT_AUTH_METHOD": "private_key_jwt",
        "CONNECTOR_PROVIDERS__SSO__DEFAULT_SCOPES": ",".join(SCOPES),
        "CONNECTOR_IDENTITY__VERIFIER": "oidc",
        "CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL": provider.discovery_url,
        "CONNECTOR_IDENTITY__OIDC__CLIENT_ID": "idp",
        "CONNECTOR_IDENTITY__OIDC__TOKEN_ENDPOINT_AUTH_METHOD": "private_key_jwt",
        # The embedded agent's grant is also used through agent-a's key at the proxy: the two share explicitly.
        "CONNECTOR_TENANTS__SHARED_GROUPS": "embedded+agent-a",
    }
    user = Identity(provider.issuer, provider.account)
    async with deploy(connector_env, tmp_path, MockOIDCProvider(), sock, user, **env) as deployment:
        yield deployment


JWT = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def our_key() -> tuple[str, str]:
    """The active client key's kid and its private `d` member (what must never be seen)."""
    keys = ClientKeys(Vault(KeyRing.from_strings([VAULT_KEY])))
    kid, key = keys._keys()[0]
    return kid, str(key.as_dict(private=True)["d"])


def scan(where: str, text: str, more: list[str] | None = None) -> None:
    """No private key (its `d`, or any PEM) and no client assertion (a JWT whose header names our key) in `text`."""
    kid, d = our_key()
    assert d not in text and "PRIVATE KEY" not in text, f"a private key in {where}"
    for secret in more or []:
        assert secret not in text, f"a grant's DPoP key in {where}"
    for token in JWT.findall(text):
        header = token.split(".", 1)[0]
        try:
            decoded = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
        except ValueError:
            continue
        assert decoded.get("kid") != kid, f"a client assertion in {where}"


async def authorize(agent: Agent, provider: Conformant) -> tuple[AuthorizationOutcome, str, list[dict[str, str]]]:
    """The agent asks; the user's browser follows every redirect. The outcome, every page the browser was shown,
    and the query of each request it made to the provider's authorization endpoint."""
    endpoint = urlsplit((await provider.op.discovery())["authorization_endpoint"])  # type: ignore[union-attr]
    asked: list[dict[str, str]] = []
    shown: list[str] = []

    async def record(request: httpx.Request) -> None:
        if (request.url.host, request.url.port, request.url.path) == (endpoint.hostname, endpoint.port, endpoint.path):
            asked.append(dict(parse_qsl(request.url.query.decode())))

    async def keep(response: httpx.Response) -> None:
        await response.aread()
        shown.append(f"{response.headers}\n{response.text}")

    outcome = agent.request()
    url = await agent.wire.client.next_url()
    async with ScriptedBrowser(event_hooks={"request": [record], "response": [keep]}) as browser:
        page = await browser.get(url)
        assert page.status_code == 200, page.text
        final = await browser.follow(await browser.submit(page, "continue"), limit=20)
        assert final.status_code == 200, f"{final.text}\n{provider.op.log()[-3000:]}"  # type: ignore[union-attr]
    return await asyncio.wait_for(outcome, 10), "\n".join(shown), asked


async def test_the_whole_flow_with_the_providers_configuration(
    provider: Conformant,
    connector_env: dict[str, str],
    tmp_path: Path,
    loopback_socket: socket.socket,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sign-in (identity verifier), consent, use, refresh and revocation, each authenticated by private_key_jwt."""
    caplog.set_level(logging.DEBUG)
    configuration = provider.op.configuration  # type: ignore[union-attr]
    async with connector(provider, connector_env, tmp_path, loopback_socket) as deployment:
        async with httpx.AsyncClient() as http:
            served = (await http.get(f"{deployment.base_url}/.well-known/jwks.json")).json()
        assert served == cli_jwks(int(loopback_socket.getsockname()[1]), tmp_path)
        async with agent_of(deployment) as agent:
            outcome, pages, asked = await authorize(agent, provider)
            assert outcome.status is AuthorizationStatus.AUTHORIZED, outcome.describe()
            wire = json.dumps(agent.wire.messages, default=str)
        # The verifier's and the provider's (with DPoP nonces, the provider's first proof had none: made again).
        exchanges = 3 if configuration in DPOP else 2
        assert await provider.token_requests("authorization_code") == exchanges
        stats = await provider.op.stats()  # type: ignore[union-attr]
        if configuration in PAR:
            assert stats["pushed_authorization_requests"] == 2  # the verifier's and the provider's
        # With PAR the browser carried client_id and request_uri only: nothing of the request in its URL.
        expected = {"client_id", "request_uri"} if configuration in PAR else None
        assert len(asked) == 2  # the verifier's and the provider's authorization requests
        for query in asked:
            assert set(query) == expected if expected else {"code_challenge", "state", "scope"} <= set(query)
        assert await userinfo(deployment, provider) == 200
        expire(deployment)
        assert await userinfo(deployment, provider) == 200
        assert await provider.token_requests("refresh_token") == 1
        # An agent's call through the sidecar's token proxy (with DPoP: a proof made by the connector, ath and nonce).
        user = deployment.local_user
        async with api_client(deployment.base_url, await make_key(deployment.connector.runtime.store)) as api:
            proxied = await api.get(
                f"/v1/proxy/{NAME}/me",
                headers={"Connector-User-Issuer": user.issuer, "Connector-User-Subject": user.subject},
            )
        assert proxied.status_code == 200 and proxied.json()["sub"] == "alice", proxied.text
        answers = proxied.text

        tokens = await stored_tokens(deployment)  # decrypted from the database
        if configuration == "resource_indicators":
            # The token is for the API alone: the OP's userinfo refuses it, so the account came from the ID token.
            discovery = await provider.op.discovery()  # type: ignore[union-attr]
            async with httpx.AsyncClient() as http:
                refused = await http.get(
                    discovery["userinfo_endpoint"], headers={"Authorization": f"Bearer {tokens['access_token']}"}
                )
            assert refused.status_code == 401
            assert (await provider.op.stats())["userinfo_requests"] == 1  # type: ignore[union-attr]  # that one
            (grant,) = await deployment.connector.runtime.store.grants.find(deployment.local_user, NAME)
            assert grant.provider_account_id == "alice"
        kept: list[str] = []
        if configuration in DPOP:
            assert tokens["token_type"] == "DPoP" and tokens["dpop_key"]["kty"] == "EC"
            kept.append(tokens["dpop_key"]["d"])
            # Copied out of the database, the access token is useless without the key: refused with no proof.
            async with httpx.AsyncClient() as http:
                for scheme in ("DPoP", "Bearer"):
                    answer = await http.get(
                        provider.userinfo_url, headers={"Authorization": f"{scheme} {tokens['access_token']}"}
                    )
                    assert answer.status_code in (400, 401), (scheme, answer.status_code)
        else:
            assert tokens["token_type"] == "Bearer" and "dpop_key" not in tokens
        assert await deployment.connector.disconnect(deployment.local_user, NAME) == 1
        assert await provider.revocations() == 1
        assert not await provider.active(tokens["refresh_token"])
        failures = await provider.failures()
        if configuration in DPOP:  # the first proof had no nonce: refused once, then made again with it
            assert failures.count("use_dpop_nonce") >= 1
        assert [f for f in failures if f != "use_dpop_nonce"] == []  # no invalid_client, no refused revocation
        database_file = Path(deployment.connector.runtime.settings.database.url.split("///", 1)[1])
        database = await asyncio.to_thread(database_file.read_bytes)
    scan("the ACP wire", wire, kept)
    scan("the pages", pages, kept)
    scan("the API answers", answers, kept)
    scan("the logs", "\n".join(r.getMessage() + json.dumps(r.__dict__, default=str) for r in caplog.records), kept)
    scan("the database", database.decode("latin-1"), kept)


async def test_providers_check_reports_the_client_key(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    async with connector(provider, connector_env, tmp_path, loopback_socket) as deployment:
        gateway = deployment.connector.runtime.providers
        report = await check_provider(gateway, gateway.entry(NAME))
    kid, _ = our_key()
    assert report.ok, report.problems
    assert "client authentication: private_key_jwt (configured (token_endpoint_auth_method))" in report.facts
    (key,) = [fact for fact in report.facts if fact.startswith("client key:")]
    assert f"ES256 key {kid} from the vault" in key and "/.well-known/jwks.json" in key
    resource = [fact for fact in report.facts if fact.startswith("resource indicators:")]
    if provider.op.configuration == "resource_indicators":  # type: ignore[union-attr]
        assert resource == [
            f"resource indicators: {RESOURCE} (RFC 8707, on the authorization and token requests); the account is "
            "the ID token's sub, userinfo not asked"
        ]
    else:
        assert resource == []
    fapi = [fact for fact in report.facts if fact.startswith("FAPI 2.0 profile:")]
    assert len(fapi) == (provider.op.configuration == "fapi2")  # type: ignore[union-attr]
    (dpop,) = [fact for fact in report.facts if fact.startswith("DPoP:")]
    if provider.op.configuration in DPOP:  # type: ignore[union-attr]
        assert dpop.startswith("DPoP: used, the entry asks for it (ES256")
    else:  # oidc-provider advertises DPoP, but nothing asks for it: Bearer tokens
        assert dpop.startswith("DPoP: not used (the provider advertises it")
    (par,) = [fact for fact in report.facts if fact.startswith("pushed authorization requests:")]
    if provider.op.configuration in PAR:  # type: ignore[union-attr]
        assert par.startswith("pushed authorization requests: used, the provider requires it")
    else:
        assert par.startswith("pushed authorization requests: not used (offered at")  # oidc-provider offers it


def test_private_key_jwt_is_chosen_when_it_is_the_only_method_listed() -> None:
    chosen = choose_auth_method(None, ["private_key_jwt", "tls_client_auth"], has_secret=True, discovered=True)
    assert chosen.method == "private_key_jwt"
    assert choose_auth_method(
        None, ["client_secret_post", "private_key_jwt"], has_secret=True, discovered=True
    ).method == ("client_secret_post")


@pytest.mark.parametrize("oidc_op", ["private_key_jwt"], indirect=True)  # a provider that offers PAR, not requires it
async def test_par_asked_by_the_entry_of_a_provider_that_only_offers_it(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    assert provider.op.configuration == "private_key_jwt"  # type: ignore[union-attr]
    async with (
        connector(provider, connector_env, tmp_path, loopback_socket, pushed_authorization_requests=True) as deployment,
        agent_of(deployment) as agent,
    ):
        outcome, _, (verifier, connection) = await authorize(agent, provider)
        assert outcome.status is AuthorizationStatus.AUTHORIZED, outcome.describe()
        report = await check_provider(
            deployment.connector.runtime.providers, deployment.connector.runtime.providers.entry(NAME)
        )
    assert {"code_challenge", "state", "scope"} <= set(verifier)  # the identity verifier's entry does not ask for PAR
    assert set(connection) == {"client_id", "request_uri"}
    assert (await provider.op.stats())["pushed_authorization_requests"] == 1  # type: ignore[union-attr]
    assert any(f.startswith("pushed authorization requests: used, the catalog entry asks for it") for f in report.facts)


# --- the FAPI 2.0 switch refuses a provider that cannot do every part ---------------------------------------------

FAPI_CAPABLE = {
    "pushed_authorization_request_endpoint": f"{ISSUER}/par",
    "token_endpoint_auth_methods_supported": ["private_key_jwt"],
    "dpop_signing_alg_values_supported": ["ES256"],
    "authorization_response_iss_parameter_supported": True,
    "code_challenge_methods_supported": ["S256"],
}


@pytest.mark.parametrize(
    ("missing", "value"),
    [
        ("pushed_authorization_request_endpoint", None),
        ("token_endpoint_auth_methods_supported", ["client_secret_basic"]),
        ("dpop_signing_alg_values_supported", None),
        ("dpop_signing_alg_values_supported", ["EdDSA"]),
        ("authorization_response_iss_parameter_supported", False),
        ("code_challenge_methods_supported", ["plain"]),
    ],
)
async def test_a_fapi2_entry_is_refused_by_a_provider_lacking_a_part(missing: str, value: object) -> None:
    catalog = oidc_catalog(CONNECTOR_PROVIDERS__OIDC__FAPI2="true")
    entry = catalog.get("oidc")
    assert (entry.token_endpoint_auth_method, entry.pushed_authorization_requests, entry.dpop) == (
        "private_key_jwt",
        True,
        True,
    )
    gateway = ProviderGateway(catalog)
    with respx.mock:
        respx.get(DISCOVERY).respond(json=discovery_document(**FAPI_CAPABLE))
        assert (await gateway.resolve("oidc")).par_reason is not None  # every part offered: it runs
        respx.get(DISCOVERY).respond(json=discovery_document(**{**FAPI_CAPABLE, missing: value}))
        with pytest.raises(DiscoveryError) as caught:
            await gateway.rediscover(entry)
        report = await check_provider(gateway, entry, keys=False)
    assert caught.value.field == missing and "FAPI 2.0" in str(caught.value)
    assert not report.ok and report.field_at_fault == missing


@pytest.mark.parametrize(
    ("setting", "value", "key"),
    [
        ("PKCE", "false", "oidc.pkce"),
        ("TOKEN_ENDPOINT_AUTH_METHOD", "client_secret_basic", "oidc.token_endpoint_auth_method"),
    ],
)
def test_a_fapi2_entry_refuses_a_setting_against_the_profile(setting: str, value: str, key: str) -> None:
    with pytest.raises(ConfigError, match=r"FAPI 2\.0") as caught:
        oidc_catalog(CONNECTOR_PROVIDERS__OIDC__FAPI2="true", **{f"CONNECTOR_PROVIDERS__OIDC__{setting}": value})
    assert key in str(caught.value)


def test_client_keys_follow_the_vault_ring_with_overlap() -> None:
    """Every replica with the ring derives the same key; a new active vault key signs, the old one stays published
    until it leaves the ring (retired); the JWKS never carries a private member."""
    new, old = generate_key("k-new"), generate_key("k-old")
    before = ClientKeys(Vault(KeyRing.from_strings([old])))
    replica = ClientKeys(Vault(KeyRing.from_strings([old])))
    assert before.jwks() == replica.jwks() and len(before.jwks()["keys"]) == 1
    during = ClientKeys(Vault(KeyRing.from_strings([new, old])))
    kids = [key["kid"] for key in during.jwks()["keys"]]
    assert kids[1] == before.active_kid and kids[0] == during.active_kid != before.active_kid
    assertion = during.assertion("conn", "https://issuer.example")
    header = json.loads(base64.urlsafe_b64decode(assertion.split(".")[0] + "=="))
    assert header["kid"] == during.active_kid
    published = KeySet.import_key_set(during.jwks())
    claims = jwt.decode(assertion, published, algorithms=["ES256"]).claims
    assert claims["iss"] == claims["sub"] == "conn" and claims["aud"] == "https://issuer.example"
    assert claims["exp"] - claims["iat"] == 60 and claims["jti"]
    after = ClientKeys(Vault(KeyRing.from_strings([new])))
    assert [key["kid"] for key in after.jwks()["keys"]] == [during.active_kid]
    assert all(set(key) == {"kty", "crv", "x", "y", "kid", "use", "alg"} for key in during.jwks()["keys"])
