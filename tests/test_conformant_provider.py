"""What a conformant OpenID provider expects, tried through the connector's real browser flow.

Each case runs twice: against panva's `oidc-provider` (OpenID Certified, its own Node process, `tests/oidc_op/`)
and against the test kit's `MockOIDCProvider.strict()`. Either is configured by its discovery URL only. The
connector is served on loopback, a scripted browser follows every redirect (the OP's login and consent are
automatic), and the agent side is a real ACP connection.

- a client secret with `+/=:` works with client_secret_basic and client_secret_post, for the code exchange, the
  refresh, the revocation and the `oidc` identity verifier;
- `offline_access` yields a refresh token (the connector adds prompt=consent, without which it is dropped);
- a 30-second access token is refreshed once per lifetime, not per call (token requests counted at the provider);
- a refresh whose ID token names another `sub` is refused (and audited);
- a narrowed grant gives the `narrowed` outcome, and asking again for the refused scopes sends no new
  `elicitation/create`.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from service import (
    AccountChoiceNeeded,
    AuthorizationOutcome,
    AuthorizationStatus,
    GrantNeedsUser,
    GrantStatus,
    Identity,
    NotAuthorized,
    SessionScope,
)
from service.core.handles import grant_aad
from service.testing import MockOIDCProvider, ScriptedBrowser

from .acp_peers import RecordingClient, Wire, connect
from .api_support import api_client, make_key
from .conftest import Deployment, deploy, write_catalog
from .oidc_op_support import OidcOp, basic_auth_header
from .test_api_events import stream
from .test_api_webhooks import receiving

NAME = "sso"
METHODS = ("client_secret_basic", "client_secret_post")
# Every character that Basic auth without RFC 6749's form-encoding gets wrong, plus some the form body must carry.
SECRETS = {"client_secret_basic": "c+o/n=n:b+==", "client_secret_post": "c+o/n=n:p e&%2B"}
ACCESS_TOKEN_TTL = 30


# --- the two providers -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def connector_port() -> int:
    """One loopback port for the module: the OP knows the connector's redirect URIs before any test runs."""
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


def op_config(port: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    clients = []
    for method, secret in SECRETS.items():
        short = method.rsplit("_", 1)[1]
        for role, path in (("conn", f"/callback/{NAME}"), ("idp", "/identity/oidc/callback")):
            clients.append(
                {
                    "client_id": f"{role}-{short}",
                    "client_secret": f"{secret}{role}",
                    "token_endpoint_auth_method": method,
                    "redirect_uris": [f"{base}{path}"],
                    "grant_types": ["authorization_code", "refresh_token"],
                    "response_types": ["code"],
                }
            )
    return {
        "clients": clients,
        "accounts": {
            "alice": {"email": "alice@example.com", "email_verified": True},
            "mallory": {"email": "mallory@example.com"},
        },
        "login_account": "alice",
        "access_token_ttl": ACCESS_TOKEN_TTL,
        "refresh_token_rotation": True,
        "scopes": ["api.read", "api.write"],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oidc_op(connector_port: int) -> AsyncIterator[OidcOp]:
    async with OidcOp.start(op_config(connector_port)) as op:
        yield op


@dataclass
class Conformant:
    """One provider under test, as the tests need it: how the connector reaches it, and what it counts."""

    kind: str
    discovery_url: str
    issuer: str
    account: str  # the `sub` of whoever signs in there
    userinfo_url: str
    op: OidcOp | None = None
    mock: MockOIDCProvider | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def client(self, method: str, role: str = "conn") -> tuple[str, str]:
        if self.op is not None:
            short = method.rsplit("_", 1)[1]
            return f"{role}-{short}", f"{SECRETS[method]}{role}"
        assert self.mock is not None
        return self.mock.client_id, self.mock.client_secret

    async def token_requests(self, grant_type: str) -> int:
        if self.op is not None:
            return int((await self.op.stats())["token_requests"].get(grant_type, 0))
        assert self.mock is not None
        return sum(1 for r in self.mock.token_requests if r["grant_type"] == grant_type)

    async def failures(self) -> list[str]:
        """Refused token or revocation requests (invalid_client, ...), by error."""
        if self.op is not None:
            stats = await self.op.stats()
            errors = [error for by_error in stats["token_errors"].values() for error in by_error]
            return errors + ["revocation"] * (stats["revocation_requests"] - stats["revocations"])
        assert self.mock is not None
        requests = [*self.mock.token_requests, *self.mock.revocation_requests]
        return [r["client_auth"] for r in requests if r["client_auth"] == "failed"]

    async def revocations(self) -> int:
        if self.op is not None:
            return int((await self.op.stats())["revocations"])
        assert self.mock is not None
        return len(self.mock.revocation_requests)

    async def active(self, token: str) -> bool:
        if self.op is not None:
            return bool((await self.op.introspect(token))["active"])
        assert self.mock is not None
        return self.mock.token_active(token)

    async def narrow(self, scopes: list[str]) -> None:
        if self.op is not None:
            await self.op.set_narrow_scopes(scopes)
        else:
            assert self.mock is not None
            self.mock.narrow_scopes = set(scopes)

    async def revoke_outside(self, token: str, method: str = "client_secret_basic") -> None:
        """Revoke `token` (and with it its grant) at the provider's RFC 7009 revocation endpoint, as the client, but
        not through the connector: what a user revoking the app at the provider amounts to."""
        client_id, secret = self.client(method)
        async with httpx.AsyncClient() as http:
            endpoint = (await http.get(self.discovery_url)).json()["revocation_endpoint"]
            answer = await http.post(
                endpoint,
                data={"token": token, "token_type_hint": "refresh_token"},
                headers={"Authorization": basic_auth_header(client_id, secret)},
            )
        assert answer.status_code == 200, answer.text

    async def sign_in_as(self, account: str) -> None:
        """Whoever signs in at the provider from now on: `alice` (the default) or `mallory`."""
        if self.op is not None:
            await self.op.set_login_account(account)
        else:
            assert self.mock is not None
            self.mock.account = {"sub": f"{account}-sub", "email": f"{account}@example.com", "name": account.title()}

    def sub_of(self, account: str) -> str:
        return account if self.op is not None else f"{account}-sub"

    async def override_next_refresh_sub(self, sub: str) -> None:
        if self.op is not None:
            await self.op.override_sub(sub)
        else:
            assert self.mock is not None
            self.mock.refresh_sub_override = sub


@pytest_asyncio.fixture(params=["oidc-provider", "strict-mock"])
async def provider(request: pytest.FixtureRequest, oidc_op: OidcOp) -> AsyncIterator[Conformant]:
    if request.param == "oidc-provider":
        op = oidc_op
        await op.reset_stats()
        await op.set_narrow_scopes([])
        await op.override_sub(None)
        await op.set_login_account("alice")
        discovery = await op.discovery()
        yield Conformant("oidc-provider", op.discovery_url, op.issuer, "alice", discovery["userinfo_endpoint"], op=op)
        return
    mock = MockOIDCProvider.strict()
    async with mock.serve_http():
        yield Conformant(
            "strict-mock",
            f"{mock.base_url}/.well-known/openid-configuration",
            mock.issuer,
            str(mock.account["sub"]),
            f"{mock.base_url}/api/user",
            mock=mock,
        )


# --- the connector ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def connector_for(
    provider: Conformant,
    connector_env: dict[str, str],
    tmp_path: Path,
    sock: socket.socket,
    *,
    method: str = "client_secret_basic",
    scopes: list[str],
    identity_verifier: bool = False,
    **extra: str,
) -> AsyncIterator[Deployment]:
    """A connector whose catalog names the provider by its discovery URL only (and its API: the issuer's origin)."""
    entry = {"discovery_url": provider.discovery_url, "oidc": True, "account_id_field": "sub"}
    catalog = write_catalog(tmp_path / "conformant.toml", {NAME: {**entry, "api_base_url": provider.issuer}})
    client_id, secret = provider.client(method)
    env = {
        "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
        "CONNECTOR_PROVIDER_SSO_CLIENT_ID": client_id,
        "CONNECTOR_PROVIDER_SSO_CLIENT_SECRET": secret,
        "CONNECTOR_PROVIDERS__SSO__TOKEN_ENDPOINT_AUTH_METHOD": method,
        "CONNECTOR_PROVIDERS__SSO__DEFAULT_SCOPES": ",".join(scopes),
        **extra,
    }
    user = None
    if identity_verifier:
        idp_id, idp_secret = provider.client(method, "idp")
        env.update(
            CONNECTOR_IDENTITY__VERIFIER="oidc",
            CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL=provider.discovery_url,
            CONNECTOR_IDENTITY__OIDC__CLIENT_ID=idp_id,
            CONNECTOR_IDENTITY__OIDC__CLIENT_SECRET=idp_secret,
            CONNECTOR_IDENTITY__OIDC__TOKEN_ENDPOINT_AUTH_METHOD=method,
        )
        user = Identity(provider.issuer, provider.account)  # who signs in at the identity provider
    placeholder = provider.mock or MockOIDCProvider()
    async with deploy(connector_env, tmp_path, placeholder, sock, user, **env) as deployment:
        yield deployment


@dataclass
class Agent:
    """The agent side of one real ACP connection to the connector, and the user's browser."""

    deployment: Deployment
    wire: Wire
    requests: int = 0

    def request(self, scopes: list[str] | None = None, **options: Any) -> asyncio.Task[AuthorizationOutcome]:
        self.requests += 1
        assert self.wire.agent.conn is not None
        return asyncio.create_task(
            self.deployment.connector.request_authorization(
                self.wire.agent.conn,
                self.wire.agent.capabilities,
                user=self.deployment.local_user,
                provider=NAME,
                scopes=scopes,
                scope=SessionScope("sess-1", tool_call_id=f"call-{self.requests}"),
                **options,
            )
        )

    async def authorize(
        self, scopes: list[str] | None = None, *, label: str | None = None, **options: Any
    ) -> AuthorizationOutcome:
        """Ask, and walk the user through every redirect in the browser (identity provider, then provider), naming the
        account `label` on the consent page when given."""
        outcome = self.request(scopes, **options)
        url = await self.wire.client.next_url()
        async with ScriptedBrowser() as browser:
            page = await browser.get(url)
            assert page.status_code == 200, page.text
            fields = {} if label is None else {"account_label": label}
            final = await browser.follow(await browser.submit(page, "continue", **fields), limit=20)
            assert final.status_code == 200, final.text
            assert "is connected" in final.text
        return await asyncio.wait_for(outcome, 10)

    def elicitations_sent(self) -> int:
        return len(self.wire.received("elicitation/create"))


@asynccontextmanager
async def agent_of(deployment: Deployment) -> AsyncIterator[Agent]:
    wire = await connect(deployment.connector, deployment.local_user, RecordingClient(answer="accept"))
    try:
        yield Agent(deployment, wire)
    finally:
        await wire.close()


REFRESHABLE = ["offline_access", "api.read"]


@asynccontextmanager
async def connected(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, sock: socket.socket
) -> AsyncIterator[tuple[Deployment, AuthorizationOutcome]]:
    """A connector with a grant at the provider for offline_access and api.read, and the outcome that made it."""
    async with (
        connector_for(provider, connector_env, tmp_path, sock, scopes=REFRESHABLE) as deployment,
        agent_of(deployment) as agent,
    ):
        yield deployment, await agent.authorize()


async def stored_tokens(deployment: Deployment) -> dict[str, Any]:
    user = deployment.local_user
    (grant,) = await deployment.connector.runtime.store.grants.find(user, NAME)
    aad = grant_aad(user.issuer, user.subject, NAME, grant.provider_account_id)
    tokens: dict[str, Any] = deployment.connector.runtime.vault.decrypt_json(
        grant.token_key_id, grant.token_ciphertext, aad=aad
    )
    return tokens


async def userinfo(deployment: Deployment, provider: Conformant) -> int:
    async with deployment.connector.http(deployment.local_user, NAME) as api:
        return (await api.get(provider.userinfo_url)).status_code


def expire(deployment: Deployment, seconds: float = ACCESS_TOKEN_TTL - 2) -> None:
    """Move the connector's clock into the last tenth of a 30-second token's life."""
    deployment.connector.clock.advance(timedelta(seconds=seconds))


# --- the cases -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
async def test_a_secret_with_reserved_characters_works_everywhere(
    provider: Conformant,
    method: str,
    connector_env: dict[str, str],
    tmp_path: Path,
    loopback_socket: socket.socket,
) -> None:
    """Code exchange, refresh, revocation and the identity verifier, with client_secret_basic or _post."""
    assert set("+/=:") <= set(provider.client(method)[1]) & set(provider.client(method, "idp")[1])
    scopes = ["openid", "offline_access", "api.read"]
    async with (
        connector_for(
            provider, connector_env, tmp_path, loopback_socket, method=method, scopes=scopes, identity_verifier=True
        ) as deployment,
        agent_of(deployment) as agent,
    ):
        outcome = await agent.authorize()  # the browser signs in at the identity provider first
        assert outcome.status is AuthorizationStatus.AUTHORIZED, outcome.describe()
        events = [e.event for e in await deployment.connector.runtime.store.audit.list()]
        assert "verified" in events  # the identity verifier's own code exchange and ID token passed
        assert await provider.token_requests("authorization_code") == 2  # the verifier's and the provider's

        assert await userinfo(deployment, provider) == 200
        expire(deployment)
        assert await userinfo(deployment, provider) == 200
        assert await provider.token_requests("refresh_token") == 1

        tokens = await stored_tokens(deployment)
        assert await deployment.connector.disconnect(deployment.local_user, NAME) == 1
        assert await provider.revocations() == 1
        assert not await provider.active(tokens["access_token"])
        assert not await provider.active(tokens["refresh_token"])
        assert await provider.failures() == []  # no request was refused (no invalid_client anywhere)
        if provider.mock is not None:
            used = {r["client_auth"] for r in [*provider.mock.token_requests, *provider.mock.revocation_requests]}
            assert used == {method}


async def test_offline_access_yields_a_refresh_token(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    async with connected(provider, connector_env, tmp_path, loopback_socket) as (deployment, outcome):
        assert outcome.status is AuthorizationStatus.AUTHORIZED, outcome.describe()
        assert "offline_access" in outcome.granted_scopes  # not dropped: the request carried prompt=consent
        assert (await stored_tokens(deployment))["refresh_token"]
        expire(deployment)
        assert await userinfo(deployment, provider) == 200
        assert await provider.token_requests("refresh_token") == 1


async def test_a_30_second_token_is_refreshed_once_per_lifetime_not_per_call(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    async with connected(provider, connector_env, tmp_path, loopback_socket) as (deployment, outcome):
        assert outcome.ok
        for lifetimes in range(3):
            async with deployment.connector.http(deployment.local_user, NAME) as api:
                statuses = {(await api.get(provider.userinfo_url)).status_code for _ in range(100)}
            assert statuses == {200}
            # One refresh per lifetime begun, however many calls: the first call of a new lifetime refreshes.
            assert await provider.token_requests("refresh_token") == lifetimes
            expire(deployment)  # into the token's last tenth


async def test_a_refresh_whose_id_token_names_another_sub_is_refused(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    async with connected(provider, connector_env, tmp_path, loopback_socket) as (deployment, outcome):
        assert outcome.ok
        before = await stored_tokens(deployment)
        await provider.override_next_refresh_sub("mallory")
        expire(deployment)
        with pytest.raises(NotAuthorized, match="authorized again"):
            await userinfo(deployment, provider)
        assert await provider.token_requests("refresh_token") == 1
        assert await stored_tokens(deployment) == before  # nothing of the other account's answer was stored
        (refused,) = await deployment.connector.runtime.store.audit.list(event="refresh_failed")
        assert refused.detail["reason"] == "invalid_id_token" and refused.detail["check"] == "sub"
        assert await provider.revocations() == 1  # the tokens issued for the other account were revoked


async def test_a_narrowed_grant_is_the_documented_outcome_and_is_not_asked_for_again(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    await provider.narrow(["api.write"])
    async with (
        connector_for(provider, connector_env, tmp_path, loopback_socket, scopes=["api.read"]) as deployment,
        agent_of(deployment) as agent,
    ):
        wanted = ["api.read", "api.write"]
        outcome = await agent.authorize(wanted)
        assert outcome.status is AuthorizationStatus.NARROWED and not outcome.ok
        assert outcome.refused_scopes == ("api.write",)
        assert "api.read" in outcome.granted_scopes and "api.write" not in outcome.granted_scopes
        assert outcome.describe() == "Access to 127.0.0.1 was granted without api.write. (refused at the provider)"
        assert await userinfo(deployment, provider) == 200  # what was granted is usable
        assert agent.elicitations_sent() == 1

        # The same scopes again: answered at once from the stored grant; no new elicitation/create.
        again = await asyncio.wait_for(agent.request(wanted), 10)
        assert again.status is AuthorizationStatus.NARROWED and again.elicitation_id is None
        assert again.refused_scopes == ("api.write",)
        assert agent.elicitations_sent() == 1
        # What was granted counts as authorized; asking again is the agent's explicit choice.
        assert (
            await asyncio.wait_for(agent.request(["api.read"]), 10)
        ).status is AuthorizationStatus.ALREADY_AUTHORIZED
        await provider.narrow([])
        asked = await agent.authorize(wanted, ask_again=True)
        assert asked.status is AuthorizationStatus.AUTHORIZED, asked.describe()
        assert agent.elicitations_sent() == 2


async def test_a_grant_revoked_at_the_provider_needs_the_user_says_why_and_heals_when_asked_again(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    """Revoked at the provider (RFC 7009, outside the connector): the next use says `needs_user` and why, once on
    /v1/events and to a webhook, and nothing is refreshed again; asked again, the user heals the same grant."""
    webhooks = {
        "CONNECTOR_WEBHOOKS__ALLOW_PRIVATE_ADDRESSES": "true",
        "CONNECTOR_WEBHOOKS__POLL_INTERVAL_SECONDS": "0.05",
        # The embedded agent's grant, watched through agent-a's key: the operator lets the two share.
        "CONNECTOR_TENANTS__SHARED_GROUPS": "embedded+agent-a",
    }
    async with (
        receiving() as receiver,
        connector_for(provider, connector_env, tmp_path, loopback_socket, scopes=REFRESHABLE, **webhooks) as deployment,
        agent_of(deployment) as agent,
    ):
        first = await agent.authorize()
        assert first.status is AuthorizationStatus.AUTHORIZED and first.grant is not None
        store = deployment.connector.runtime.store
        key = await make_key(store)
        user = {"issuer": deployment.local_user.issuer, "subject": deployment.local_user.subject}
        async with api_client(deployment.base_url, key) as api, stream(deployment.base_url, key) as sse:
            assert (await api.post("/v1/webhooks", json={"url": receiver.url})).status_code == 201
            tokens = await stored_tokens(deployment)
            await provider.revoke_outside(tokens["refresh_token"])

            expire(deployment)  # the next use refreshes
            with pytest.raises(GrantNeedsUser) as refused:
                await userinfo(deployment, provider)
            assert refused.value.reason == "revoked" and "revoked or has expired" in refused.value.sentence
            for _ in range(2):  # never refreshed again: every use says why at once
                with pytest.raises(GrantNeedsUser):
                    await userinfo(deployment, provider)
            assert await provider.token_requests("refresh_token") == 1
            assert await stored_tokens(deployment) == tokens  # kept as it was

            ((_, told),) = await sse.wait_for(1)
            await receiver.wait_until(lambda r: len(r.requests) >= 1)
            (hooked,) = receiver.requests
            hooked_body = json.loads(hooked.body)
            assert hooked_body == {"type": "grant.needs_user", "timestamp": hooked_body["timestamp"], "data": told}
            assert told == {
                "id": told["id"],
                "type": "grant.needs_user",
                "grantId": first.grant.id,
                "provider": NAME,
                "accountId": first.grant.account_id,
                "issuer": user["issuer"],
                "subject": user["subject"],
                "reason": "revoked",
            }
            (listed,) = (await api.get("/v1/grants", params=user)).json()["grants"]
            assert (listed["status"], listed["reason"]) == ("needs_user", "revoked")
            assert listed["reasonText"] == refused.value.sentence

            # Asked again: a new elicitation that says why (not already_authorized), and the same grant heals.
            again = await agent.authorize()
            assert again.status is AuthorizationStatus.AUTHORIZED and again.grant is not None
            assert again.grant.id == first.grant.id and again.grant.status is GrantStatus.ACTIVE
            message = agent.wire.received("elicitation/create")[-1]["params"]["message"]
            assert refused.value.sentence in message
            (_, (_, recovered)) = await sse.wait_for(2)
            assert (recovered["type"], recovered["grantId"], recovered["reason"]) == (
                "grant.recovered",
                first.grant.id,
                "revoked",
            )
            (healed,) = (await api.get("/v1/grants", params=user)).json()["grants"]
            assert healed["status"] == "active" and healed["grantId"] == first.grant.id
            assert await userinfo(deployment, provider) == 200
        audit = [e.event for e in await store.audit.list() if e.event.startswith("grant_")]
        assert audit == ["grant_needs_user", "grant_recovered"]
        # No secret in anything the reason went into.
        told_everywhere = json.dumps([told, recovered, listed, str(refused.value), message])
        assert tokens["refresh_token"] not in told_everywhere and tokens["access_token"] not in told_everywhere


async def test_two_accounts_at_one_provider_are_each_chosen_by_account(
    provider: Conformant, connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket
) -> None:
    """One user, two accounts at one provider (alice's work account, then mallory as the personal one): each a grant
    of its own, each used when named, an error naming both when none is; one more scope updates the one named."""
    async with (
        connector_for(provider, connector_env, tmp_path, loopback_socket, scopes=REFRESHABLE) as deployment,
        agent_of(deployment) as agent,
    ):
        user = deployment.local_user
        await provider.sign_in_as("alice")
        work = await agent.authorize(label="work")
        assert work.ok and work.grant is not None and work.grant.account_id == provider.sub_of("alice")
        await provider.sign_in_as("mallory")
        home = await agent.authorize(account="home")  # not held: asked for, named "home" on the consent page
        assert home.status is AuthorizationStatus.AUTHORIZED and home.grant is not None
        assert (home.grant.account_id, home.grant.account_label) == (provider.sub_of("mallory"), "home")
        assert agent.elicitations_sent() == 2
        with pytest.raises(AccountChoiceNeeded) as raised:
            await userinfo(deployment, provider)
        assert raised.value.labels == ("home", "work")
        for account, sub in (("work", "alice"), ("HOME", "mallory"), (provider.sub_of("alice"), "alice")):
            async with deployment.connector.http(user, NAME, account=account) as api:
                answer = await api.get(provider.userinfo_url)
            assert answer.status_code == 200 and answer.json()["sub"] == provider.sub_of(sub)
        expire(deployment)  # each account's tokens refresh as its own (the ID token's sub is checked)
        async with deployment.connector.http(user, NAME, account="home") as api:
            assert (await api.get(provider.userinfo_url)).json()["sub"] == provider.sub_of("mallory")

        await provider.sign_in_as("alice")
        before = {g.account_label: g for g in await deployment.connector.runtime.store.grants.find(user, NAME)}
        more = await agent.authorize([*REFRESHABLE, "api.write"], account="work")
        assert more.status is AuthorizationStatus.AUTHORIZED and more.grant is not None
        after = {g.account_label: g for g in await deployment.connector.runtime.store.grants.find(user, NAME)}
        assert set(after) == {"work", "home"}
        assert after["work"].id == before["work"].id and "api.write" in after["work"].scopes
        assert after["home"].id == before["home"].id and "api.write" not in after["home"].scopes
