"""Tenants kept apart, on SQLite and PostgreSQL: a grant made through one tenant's API key (or through the embedded
connector, tenant `embedded`) is seen, used, revoked and told of (the event stream, webhooks) only through that
tenant; another tenant's attempts find nothing, as if the grant never was. Sharing is the operator's explicit
setting (`[tenants] shared_groups`)."""

from __future__ import annotations

import asyncio
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from service import Identity
from service.cli.program import main
from service.core.errors import NotAuthorized
from service.core.records import GrantRecord
from service.store import Store, migrate
from service.testing import ScriptedBrowser

from .api_support import api_client, create_body, make_key, user_headers
from .conftest import Deploy, Deployment
from .test_api_events import stream
from .test_api_webhooks import FAST, receiving


async def authorize_through(deployment: Deployment, api: httpx.AsyncClient) -> dict[str, Any]:
    """The user authorizes through this client's tenant (a real browser flow); the grant as that tenant lists it."""
    user = deployment.local_user
    body = (await api.post("/v1/elicitations", json=create_body(user))).json()
    assert body["status"] == "created", body
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(body["url"])).status_code == 200
    (grant,) = await grants_of(deployment, api)
    return grant


async def grants_of(deployment: Deployment, api: httpx.AsyncClient) -> list[dict[str, Any]]:
    user = deployment.local_user
    answer = await api.get("/v1/grants", params={"issuer": user.issuer, "subject": user.subject})
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["grants"]
    return found


async def test_another_tenant_cannot_see_use_revoke_or_hear_of_a_grant(deploy_with: Deploy, database_url: str) -> None:
    async with (
        deploy_with(CONNECTOR_DATABASE__URL=database_url, **FAST) as deployment,
        receiving() as hook_a,
        receiving() as hook_b,
    ):
        store = deployment.connector.runtime.store
        user = deployment.local_user
        key_a, key_b = await make_key(store, "agent-a"), await make_key(store, "agent-b")
        async with (
            api_client(deployment.base_url, key_a) as api_a,
            api_client(deployment.base_url, key_b) as api_b,
            stream(deployment.base_url, key_a) as events_a,
            stream(deployment.base_url, key_b) as events_b,
        ):
            assert (await api_a.post("/v1/webhooks", json={"url": hook_a.url})).status_code == 201
            assert (await api_b.post("/v1/webhooks", json={"url": hook_b.url})).status_code == 201
            grant = await authorize_through(deployment, api_a)

            # List: agent-b sees nothing of it.
            assert await grants_of(deployment, api_b) == []
            # Use: agent-b's request is not settled by it (a new elicitation is needed), nor its grants-only look.
            asked = (await api_b.post("/v1/elicitations", json=create_body(user))).json()
            assert asked["status"] == "created" and asked["grant"] is None
            await api_b.post(f"/v1/elicitations/{asked['elicitationId']}/cancel")
            looked = (await api_b.post("/v1/elicitations", json=create_body(user, grantsOnly=True))).json()
            assert (looked["status"], looked["grant"]) == ("needs_user", None)
            covered = (await api_a.post("/v1/elicitations", json=create_body(user))).json()
            assert (covered["status"], covered["grant"]["grantId"]) == ("already_authorized", grant["grantId"])
            # Proxy: agent-b holds no grant there; agent-a's request carries the token.
            calls = len(deployment.provider.api_calls)
            refused = await api_b.get("/v1/proxy/github/user", headers=user_headers(user))
            assert (refused.status_code, refused.json()["error"]["code"]) == (403, "no_grant")
            assert len(deployment.provider.api_calls) == calls  # nothing was sent with agent-a's token
            assert (await api_a.get("/v1/proxy/github/user", headers=user_headers(user))).status_code == 200
            # The embedded connector (its own tenant) neither finds nor uses it.
            assert await deployment.connector.find_grant(user, "github") is None
            with pytest.raises(NotAuthorized):
                async with deployment.connector.http(user, "github"):
                    pass
            assert await deployment.connector.disconnect(user, "github") == 0
            # Revoke: agent-b's attempt is an unknown grant and changes nothing; agent-a's revokes it.
            hidden = await api_b.delete(f"/v1/grants/{grant['grantId']}")
            assert (hidden.status_code, hidden.json()["error"]["code"]) == (404, "unknown_grant")
            assert [g["grantId"] for g in await grants_of(deployment, api_a)] == [grant["grantId"]]
            assert (await api_a.delete(f"/v1/grants/{grant['grantId']}")).status_code == 204

            # Events: grant.revoked reaches agent-a's stream and webhook only. agent-b's stream and webhook hear
            # only its own cancelled elicitation (waited for after agent-a's revocation, so nothing is in flight).
            told_a = await events_a.wait_for(2)
            assert [e["type"] if "type" in e else e["status"] for _, e in told_a] == ["completed", "grant.revoked"]
            await hook_a.wait_until(lambda r: len(r.requests) >= 2)
            one_more = (await api_b.post("/v1/elicitations", json=create_body(user))).json()
            await api_b.post(f"/v1/elicitations/{one_more['elicitationId']}/cancel")
            told_b = await events_b.wait_for(2)
            await hook_b.wait_until(lambda r: len(r.requests) >= 2)
            await asyncio.sleep(0.3)  # a delivery the fan-out would still make arrives by now
    assert [e["status"] for _, e in told_b] == ["cancelled", "cancelled"]
    assert all("grantId" not in e for _, e in events_b.events)
    types_b = [json.loads(r.body)["type"] for r in hook_b.requests]
    assert types_b == ["elicitation.cancelled", "elicitation.cancelled"]
    types_a = sorted(json.loads(r.body)["type"] for r in hook_a.requests)
    assert types_a == ["elicitation.completed", "grant.revoked"]
    assert [e.event for e in await store.audit.list(event="disconnected")] == ["disconnected"]


async def test_each_tenant_holds_its_own_grant_of_the_same_account(deploy_with: Deploy, database_url: str) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        store = deployment.connector.runtime.store
        key_a, key_b = await make_key(store, "agent-a"), await make_key(store, "agent-b")
        async with api_client(deployment.base_url, key_a) as api_a, api_client(deployment.base_url, key_b) as api_b:
            grant_a = await authorize_through(deployment, api_a)
            grant_b = await authorize_through(deployment, api_b)  # the same user and provider account
            assert grant_a["grantId"] != grant_b["grantId"]
            assert grant_a["accountId"] == grant_b["accountId"]
            assert (await api_b.delete(f"/v1/grants/{grant_b['grantId']}")).status_code == 204
            assert [g["grantId"] for g in await grants_of(deployment, api_a)] == [grant_a["grantId"]]
            assert await grants_of(deployment, api_b) == []
            user = deployment.local_user
            assert (await api_a.get("/v1/proxy/github/user", headers=user_headers(user))).status_code == 200
        rows = await store.grants.find(deployment.local_user, "github")
        assert [(g.id, g.tenant) for g in rows] == [(grant_a["grantId"], "agent-a")]


async def test_shared_groups_share_grants_between_the_tenants_they_name(deploy_with: Deploy) -> None:
    shared = {"CONNECTOR_TENANTS__SHARED_GROUPS": "agent-a+agent-b,embedded+agent-c"}
    async with deploy_with(**shared) as deployment:
        store = deployment.connector.runtime.store
        user = deployment.local_user
        keys = {name: await make_key(store, name) for name in ("agent-a", "agent-b", "agent-c", "agent-d")}
        async with (
            api_client(deployment.base_url, keys["agent-a"]) as api_a,
            api_client(deployment.base_url, keys["agent-b"]) as api_b,
            api_client(deployment.base_url, keys["agent-c"]) as api_c,
            api_client(deployment.base_url, keys["agent-d"]) as api_d,
        ):
            grant = await authorize_through(deployment, api_a)
            assert [g["grantId"] for g in await grants_of(deployment, api_b)] == [grant["grantId"]]
            assert (await api_b.get("/v1/proxy/github/user", headers=user_headers(user))).status_code == 200
            for outsider in (api_c, api_d):  # not in agent-a's group
                assert await grants_of(deployment, outsider) == []
                refused = await outsider.get("/v1/proxy/github/user", headers=user_headers(user))
                assert refused.status_code == 403
            assert await deployment.connector.find_grant(user, "github") is None  # embedded shares with agent-c
            assert (await api_b.delete(f"/v1/grants/{grant['grantId']}")).status_code == 204  # shared: revocable

            # The embedded connector's grant: agent-c (its group) sees it, agent-a does not.
            via_c = await authorize_through(deployment, api_c)
            found = await deployment.connector.find_grant(user, "github")
            assert found is not None and found.id == via_c["grantId"]
            assert await grants_of(deployment, api_a) == []


def test_a_key_cannot_take_the_embedded_tenant_and_sharing_is_checked(connector_env: dict[str, str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["api-keys", "create", "--tenant", "embedded"], env=connector_env, stdout=out, stderr=err)
    assert code != 0 and "embedded connector's own tenant" in err.getvalue() and "acpk_" not in out.getvalue()
    for bad in ("agent-a", "agent-a+Bad Name"):
        out, err = io.StringIO(), io.StringIO()
        env = {**connector_env, "CONNECTOR_TENANTS__SHARED_GROUPS": bad}
        assert main(["api-keys", "list"], env=env, stdout=out, stderr=err) != 0
        assert "shared_groups" in err.getvalue()


async def test_the_grants_listing_pages_by_keyset_and_filters_by_tenant(database_url: str) -> None:
    migrate(database_url)
    store = Store.from_url(database_url)
    try:
        start = datetime.now(UTC)
        made = []
        for n in range(7):  # two share a time: the id orders them
            at = start + timedelta(seconds=min(n, 5))
            user = Identity("https://login.example.com", f"user-{n}")
            record = GrantRecord(
                f"g{n}", user, "github", "acct", ("repo",), "k1", b"-", None, at, at, tenant=("a", "b")[n % 2]
            )
            made.append(await store.grants.upsert(record))
        newest_first = sorted(made, key=lambda g: (-g.updated_at.timestamp(), g.id))

        async def pages(**given: Any) -> list[list[str]]:
            found: list[list[str]] = []
            after = None
            while page := await store.grants.listed(after=after, limit=2, **given):
                found.append([g.id for g in page])
                after = (page[-1].updated_at, page[-1].id)
            return found

        every = await pages()
        assert [g for page in every for g in page] == [g.id for g in newest_first]
        assert [len(page) for page in every] == [2, 2, 2, 1]
        only_a = [g for page in await pages(tenants={"a"}) for g in page]
        assert only_a == [g.id for g in newest_first if g.tenant == "a"]
        assert [g.id for g in await store.grants.listed(tenants={"a", "b"}, provider="github", limit=3)] == [
            g.id for g in newest_first[:3]
        ]
    finally:
        await store.close()
