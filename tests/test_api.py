"""The `/v1` API on a real loopback server: elicitations, answers, long-poll, cancel, grants, keys, OpenAPI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from service import ElicitationStatus
from service.core.handles import new_id
from service.core.records import GrantRecord
from service.testing import ScriptedBrowser

from .api_support import api_client, create_body, make_key
from .conftest import BOB, Deployment


async def test_full_flow_over_the_api(deployment: Deployment) -> None:
    key = await make_key(deployment.connector.runtime.store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        created = await api.post("/v1/elicitations", json=create_body(user, connectionId="conn-7"))
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["status"] == "created"
        eid = body["elicitationId"]
        assert body["url"] == f"{deployment.base_url}/connect/{eid}"
        assert body["message"] and body["expiresAt"]
        assert body["elicitation"]["status"] == "pending" and body["elicitation"]["connectionId"] == "conn-7"
        # The consent page names the key's agent, not the deployment's.
        async with ScriptedBrowser() as browser:
            page = await browser.get(body["url"])
            assert "Agent AGENT-A" in page.text

        accepted = await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "accept"})
        assert accepted.status_code == 200 and accepted.json()["status"] == "consented"
        assert accepted.json()["answered"] is True

        waiting = asyncio.create_task(api.get(f"/v1/elicitations/{eid}", params={"wait": "30"}))
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(body["url"])).status_code == 200
        state = (await waiting).json()
        assert state["status"] == "completed" and state["outcome"] == "authorized"
        assert state["grant"]["provider"] == "github" and state["grant"]["accountId"] == "4242"
        assert state["grant"]["connection"] == {}  # github needs no per-connection value
        assert set(state["grant"]) == {
            "connection",
            "grantId",
            "provider",
            "accountId",
            "accountLabel",
            "accountName",
            "scopes",
            "createdAt",
            "updatedAt",
            "expiresAt",
            "needsUserAgain",
            "status",
            "reason",
            "reasonText",
            "lastRefreshAt",
            "lastFailureAt",
            "nextRefreshAt",
        }
        assert state["grant"]["needsUserAgain"] is False
        assert (state["grant"]["status"], state["grant"]["reason"], state["grant"]["reasonText"]) == (
            "active",
            None,
            None,
        )

        again = await api.post("/v1/elicitations", json=create_body(user))
        assert again.status_code == 200
        assert again.json()["status"] == "already_authorized"
        assert again.json()["grant"]["grantId"] == state["grant"]["grantId"]

        grants = await api.get("/v1/grants", params={"issuer": user.issuer, "subject": user.subject})
        assert [g["grantId"] for g in grants.json()["grants"]] == [state["grant"]["grantId"]]
        text = json.dumps([created.json(), accepted.json(), state, again.json(), grants.json()])
    for secret in deployment.provider.secrets_issued():
        assert secret not in text


async def test_grants_only_answers_from_stored_grants_and_creates_nothing(deployment: Deployment) -> None:
    """What the Python client asks first (and always, for a client without URL mode): `needs_user` without a
    grant that settles the request, `narrowed` or `already_authorized` with one; never an elicitation."""
    store = deployment.connector.runtime.store
    key = await make_key(store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        body = create_body(user, scopes=["repo", "admin:org"], grantsOnly=True)
        none = await api.post("/v1/elicitations", json=body, headers={"Idempotency-Key": "look-1"})
        assert none.status_code == 200, none.text
        assert (none.json()["status"], none.json()["elicitationId"], none.json()["grant"]) == ("needs_user", None, None)
        assert none.json()["providerDisplayName"] == "Mock Provider"
        now = datetime.now(UTC)
        grant = GrantRecord(
            new_id(16),
            user,
            "github",
            "acct-n",
            ("repo",),
            "k1",
            b"-",
            None,
            now,
            now,
            ("admin:org",),
            tenant="agent-a",
        )
        await store.grants.upsert(grant)
        narrowed = (await api.post("/v1/elicitations", json=body)).json()
        assert (narrowed["status"], narrowed["refusedScopes"]) == ("narrowed", ["admin:org"])
        covered = (await api.post("/v1/elicitations", json={**body, "scopes": ["repo"]})).json()
        assert (covered["status"], covered["grant"]["grantId"]) == ("already_authorized", grant.id)
        asked_again = (await api.post("/v1/elicitations", json={**body, "askAgain": True})).json()
        assert asked_again["status"] == "needs_user"
    assert await store.audit.list(event="created") == []


async def test_url_mode_false_answers_from_grants_else_unsupported_and_audits_it(deployment: Deployment) -> None:
    """An agent whose client cannot take a URL-mode elicitation says so: stored grants still answer; without one
    the answer is `unsupported`, nothing is created, and the audit log says so as on the embedded path."""
    store = deployment.connector.runtime.store
    key = await make_key(store, "agent-u")
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        body = create_body(user, scopes=["repo"], urlMode=False)
        unsupported = await api.post("/v1/elicitations", json=body)
        assert unsupported.status_code == 200, unsupported.text
        assert (unsupported.json()["status"], unsupported.json()["elicitationId"]) == ("unsupported", None)
        now = datetime.now(UTC)
        await store.grants.upsert(
            GrantRecord(new_id(16), user, "github", "acct", ("repo",), "k1", b"-", None, now, now, tenant="agent-u")
        )
        assert (await api.post("/v1/elicitations", json=body)).json()["status"] == "already_authorized"
    (audited,) = await store.audit.list(event="unsupported_client")
    assert (audited.provider, audited.detail["tenant"]) == ("github", "agent-u")
    assert await store.audit.list(event="created") == []


async def test_idempotency_key_gives_the_same_elicitation_once(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key = await make_key(store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        headers = {"Idempotency-Key": "req-1"}
        results = await asyncio.gather(
            *(api.post("/v1/elicitations", json=create_body(user), headers=headers) for _ in range(5))
        )
        ids = {r.json()["elicitationId"] for r in results}
        assert len(ids) == 1
        assert sorted(r.status_code for r in results) == [200, 200, 200, 200, 201]
        different = await api.post("/v1/elicitations", json=create_body(user, scopes=["admin"]), headers=headers)
        assert different.status_code == 409 and different.json()["error"]["code"] == "idempotency_conflict"
    created = [e for e in await store.audit.list(event="created")]
    assert len(created) == 1


async def test_keys_tenants_and_allow_lists(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key_a = await make_key(store, "agent-a")
    key_b = await make_key(store, "agent-b")
    only_gitlab = await make_key(store, "agent-c", providers=["gitlab"])
    user = deployment.local_user
    async with api_client(deployment.base_url, key_a) as api:
        eid = (await api.post("/v1/elicitations", json=create_body(user))).json()["elicitationId"]
    async with api_client(deployment.base_url, None) as anonymous:
        refused = await anonymous.get(f"/v1/elicitations/{eid}")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert refused.headers["www-authenticate"].startswith("Bearer")
        wrong = await anonymous.get(f"/v1/elicitations/{eid}", headers={"Authorization": "Bearer acpk_nope"})
        assert wrong.status_code == 401
    async with api_client(deployment.base_url, key_b) as other_tenant:
        for method, path in [
            ("GET", f"/v1/elicitations/{eid}"),
            ("POST", f"/v1/elicitations/{eid}/cancel"),
        ]:
            response = await other_tenant.request(method, path)
            assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_elicitation"
        answer = await other_tenant.post(f"/v1/elicitations/{eid}/answer", json={"action": "decline"})
        assert answer.status_code == 404
    async with api_client(deployment.base_url, only_gitlab) as limited:
        refused = await limited.post("/v1/elicitations", json=create_body(user))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "provider_not_allowed"
    record = await deployment.connector.elicitation(eid)
    assert record is not None and record.status is ElicitationStatus.PENDING  # the other tenant changed nothing


async def test_answers_cancel_and_their_refusals(deployment: Deployment) -> None:
    key = await make_key(deployment.connector.runtime.store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:

        async def new(**extra: object) -> str:
            response = await api.post("/v1/elicitations", json=create_body(user, **extra))
            return str(response.json()["elicitationId"])

        declined = await new()
        state = (await api.post(f"/v1/elicitations/{declined}/answer", json={"action": "decline"})).json()
        assert (state["status"], state["outcome"]) == ("declined", "declined")
        twice = await api.post(f"/v1/elicitations/{declined}/answer", json={"action": "accept"})
        assert twice.status_code == 409 and twice.json()["error"]["code"] == "already_answered"

        errored = await new(scope={"requestId": 12})
        state = (
            await api.post(f"/v1/elicitations/{errored}/answer", json={"action": "client_error", "code": -32602})
        ).json()
        assert (state["status"], state["outcome"], state["requestId"]) == ("failed", "client_error", 12)
        assert "-32602" in state["reason"]

        # A cancel with the client's reason (its _meta.message) is a refusal, kept with the reason (sanitised).
        refused = await new()
        body = {"action": "cancel", "message": "not allowed\u202e by policy"}
        state = (await api.post(f"/v1/elicitations/{refused}/answer", json=body)).json()
        assert (state["status"], state["outcome"]) == ("cancelled", "refused")
        assert state["reason"] == "client_refused: not allowed by policy"
        dismissed = await new()
        state = (await api.post(f"/v1/elicitations/{dismissed}/answer", json={"action": "cancel"})).json()
        assert (state["outcome"], state["reason"]) == ("cancelled", "dismissed in the client")

        cancelled = await new()
        state = (await api.post(f"/v1/elicitations/{cancelled}/cancel")).json()
        assert (state["status"], state["outcome"]) == ("cancelled", "cancelled")
        again = await api.post(f"/v1/elicitations/{cancelled}/cancel")
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_ended"

        open_one = await new()
        quick = await api.get(f"/v1/elicitations/{open_one}", params={"wait": "0"})
        assert quick.json()["status"] == "pending"
        too_long = await api.get(f"/v1/elicitations/{open_one}", params={"wait": "3600"})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "invalid_input"


async def test_expired_elicitation_reads_as_expired(deployment: Deployment) -> None:
    key = await make_key(deployment.connector.runtime.store)
    async with api_client(deployment.base_url, key) as api:
        eid = (await api.post("/v1/elicitations", json=create_body(deployment.local_user))).json()["elicitationId"]
        deployment.connector.clock.advance(timedelta(seconds=601))
        state = (await api.get(f"/v1/elicitations/{eid}", params={"wait": "5"})).json()
    assert (state["status"], state["outcome"]) == ("expired", "expired")


async def test_delete_grant_revokes_then_deletes(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    key = await make_key(store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        body = (await api.post("/v1/elicitations", json=create_body(user))).json()
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(body["url"])).status_code == 200
        (grant,) = (await api.get("/v1/grants", params={"issuer": user.issuer, "subject": user.subject})).json()[
            "grants"
        ]
        other = await make_key(store, "agent-b", providers=["gitlab"])
        async with api_client(deployment.base_url, other) as not_allowed:
            hidden = await not_allowed.delete(f"/v1/grants/{grant['grantId']}")
            assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "unknown_grant"
        deleted = await api.delete(f"/v1/grants/{grant['grantId']}")
        assert deleted.status_code == 204
        missing = await api.delete(f"/v1/grants/{grant['grantId']}")
        assert missing.status_code == 404
    assert await store.grants.find(user, "github") == []
    refresh = deployment.provider.issued_refresh_tokens[0]
    assert not deployment.provider.token_active(refresh)  # revoked at the provider before the row was deleted
    assert [e.event for e in await store.audit.list(event="disconnected")] == ["disconnected"]


async def test_grants_of_another_user_are_not_listed(deployment: Deployment) -> None:
    key = await make_key(deployment.connector.runtime.store)
    async with api_client(deployment.base_url, key) as api:
        response = await api.get("/v1/grants", params={"issuer": BOB.issuer, "subject": BOB.subject})
        assert response.json() == {"grants": []}
        missing = await api.get("/v1/grants", params={"issuer": BOB.issuer})
        assert missing.status_code == 400 and "subject" in missing.json()["error"]["message"]


async def test_openapi_document_is_valid_and_names_every_route(deployment: Deployment) -> None:
    async with api_client(deployment.base_url, None) as api:
        document = (await api.get("/v1/openapi.json")).json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    assert {
        "/v1/elicitations",
        "/v1/elicitations/{elicitation_id}",
        "/v1/elicitations/{elicitation_id}/answer",
        "/v1/elicitations/{elicitation_id}/cancel",
        "/v1/grants",
        "/v1/grants/{grant_id}",
        "/v1/proxy/{provider}/{path}",
    } <= set(document["paths"])
    schemas = document["components"]["schemas"]
    # Generated from the models the handlers validate with: unknown fields are refused, camelCase on the wire.
    assert schemas["CreateElicitation"]["additionalProperties"] is False
    assert "connectionId" in schemas["CreateElicitation"]["properties"]
    assert "409" in document["paths"]["/v1/elicitations/{elicitation_id}/answer"]["post"]["responses"]


@pytest.mark.duration(11)
def test_api_keys_cli_creates_lists_and_revokes(connector_env: dict[str, str], tmp_path: Path) -> None:
    env = {**os.environ, **connector_env}
    cli = [sys.executable, "-m", "service.cli"]
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
    created = subprocess.run(
        [*cli, "api-keys", "create", "--tenant", "billing-bot", "--provider", "github"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    key = created.stdout.strip()
    assert key.startswith("acpk_ak_")
    listed = subprocess.run([*cli, "api-keys", "list"], env=env, check=True, capture_output=True, text=True).stdout
    assert "billing-bot" in listed and "github" in listed and key not in listed
    row = next(line for line in listed.splitlines() if "billing-bot" in line)
    key_id = row.split()[0]
    assert key.startswith(f"acpk_{key_id}_")
    subprocess.run([*cli, "api-keys", "revoke", key_id], env=env, check=True, capture_output=True)
    again = subprocess.run([*cli, "api-keys", "revoke", key_id], env=env, capture_output=True, text=True)
    assert again.returncode == 1 and "no live key" in again.stderr
    bad = subprocess.run(
        [*cli, "api-keys", "create", "--tenant", "Bad Tenant!"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "tenant" in bad.stderr and "Traceback" not in bad.stderr
