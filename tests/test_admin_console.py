"""The operator console (`/admin`) on a real loopback server, through the operator API key: every page, the
actions (revoke, cancel, rotate) with their CSRF tokens and confirmation, keyset paging, the CSV export, its own
listener; strangers (401) and agents (403) refused on every route."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from service import Identity
from service.core.handles import new_id
from service.core.records import GrantRecord
from service.store import GrantFilter

from .admin_support import ACCESS_TOKEN, OPERATOR_KEY, Seeded, csrf_of, seeded_console
from .conftest import Deploy
from .sidecar_support import free_port


def _no_secret(seeded: Seeded, text: str) -> None:
    for secret in (ACCESS_TOKEN, OPERATOR_KEY, seeded.agent_key, seeded.webhook_secret):
        assert secret not in text


async def test_every_page_shows_what_the_connector_holds(deploy_with: Deploy, database_url: str) -> None:
    async with seeded_console(deploy_with, CONNECTOR_DATABASE__URL=database_url) as seeded, seeded.operator() as op:
        pages = {
            "/admin": ["Grants by provider", "github", "Pending elicitations", "Webhook backlog"],
            "/admin/grants": [seeded.grant.id, "acct-1", "active"],
            f"/admin/grants?user={seeded.grant.identity.subject}&provider=github": [seeded.grant.id],
            "/admin/grants?provider=gitlab": ["No grants match."],
            f"/admin/grants?tenant={seeded.grant.tenant}": [seeded.grant.id],
            "/admin/grants?tenant=agent-b": ["No grants match."],
            "/admin/elicitations": [seeded.elicitation_id, "agent-a", "pending"],
            "/admin/elicitations?view=recent": [seeded.elicitation_id],
            "/admin/audit": ["created"],
            "/admin/audit?event=created&provider=github": [seeded.elicitation_id],
            "/admin/webhooks": [seeded.endpoint.id, "agent-a", "http://127.0.0.1:9/hook"],
            f"/admin/webhooks/{seeded.endpoint.id}": ["No deliveries."],
            "/admin/keys": ["k1", "primary"],
        }
        for path, expected in pages.items():
            response = await op.get(path)
            assert response.status_code == 200, (path, response.text)
            assert response.headers["content-type"].startswith("text/html")
            assert "default-src 'none'" in response.headers["content-security-policy"]
            for text in expected:
                assert text in response.text, (path, text)
            _no_secret(seeded, response.text)
        # A filter that matches nothing, and bad input: a 400 with a sentence, never a 500.
        assert "No events match." in (await op.get("/admin/audit?user=nobody")).text
        for bad in (
            "/admin/grants?after=xyz",
            "/admin/audit?since=yesterday",
            "/admin/grants?status=bogus",
            "/admin/elicitations?view=all",
            "/admin/audit?after=" + "A" * 300,
        ):
            refused = await op.get(bad)
            assert refused.status_code == 400 and refused.headers["x-connector-error"] == "invalid_input", bad
        assert (await op.get("/admin/grants/nope/revoke")).status_code == 404
        assert (await op.get("/admin/no-such-page")).status_code == 404  # for an operator; a stranger gets 401


async def test_strangers_get_401_and_agents_403_on_every_route(deploy_with: Deploy) -> None:
    async with seeded_console(deploy_with) as seeded:
        kinds = {
            "stranger": ({}, 401),
            "wrong key": ({"Authorization": "Bearer " + "x" * 40}, 401),
            "basic auth": ({"Authorization": "Basic b3A6b3A="}, 401),
            "agent key": ({"Authorization": f"Bearer {seeded.agent_key}"}, 403),
            "forged session": ({"Cookie": "connector-admin=eyJuIjoiZXZlIn0.k1.AAAA"}, 401),
        }
        async with httpx.AsyncClient(base_url=seeded.base_url, timeout=30) as client:
            for method, path in seeded.routes():
                for kind, (headers, status) in kinds.items():
                    response = await client.request(method, path, headers=headers, data={"confirm": "yes"})
                    assert response.status_code == status, (kind, method, path, response.text)
                    _no_secret(seeded, response.text)
        # Nothing was done: the grant, the elicitation and the secret are as they were.
        store = seeded.deployment.connector.runtime.store
        assert await store.grants.get(seeded.grant.id) is not None
        assert (await store.elicitations.get(seeded.elicitation_id)).status.value == "pending"  # type: ignore[union-attr]
        assert (
            await store.webhooks.endpoint(seeded.endpoint.id)
        ).secret_ciphertext == seeded.endpoint.secret_ciphertext  # type: ignore[union-attr]


async def test_revoke_needs_its_csrf_token_and_a_confirmation_and_is_audited(
    deploy_with: Deploy, database_url: str
) -> None:
    async with seeded_console(deploy_with, CONNECTOR_DATABASE__URL=database_url) as seeded, seeded.operator() as op:
        store = seeded.deployment.connector.runtime.store
        path = f"/admin/grants/{seeded.grant.id}/revoke"
        page = await op.get(path)
        assert "Revoke" in page.text and seeded.grant.id in page.text
        token = csrf_of(page.text)
        other = csrf_of((await op.get(f"/admin/elicitations/{seeded.elicitation_id}/cancel")).text)
        for form, code in (
            ({"confirm": "yes"}, "operator_csrf_failed"),
            ({"csrf": other, "confirm": "yes"}, "operator_csrf_failed"),  # another action's token
            ({"csrf": token + "x", "confirm": "yes"}, "operator_csrf_failed"),
            ({"csrf": token}, "confirm_required"),
        ):
            refused = await op.post(path, data=form)
            assert refused.headers["x-connector-error"] == code, refused.text
            assert refused.status_code in (400, 403)
        assert await store.grants.get(seeded.grant.id) is not None
        done = await op.post(path, data={"csrf": token, "confirm": "yes"})
        assert done.status_code == 200 and "revoked and deleted" in done.text
        assert await store.grants.get(seeded.grant.id) is None
        [line] = await store.audit.list(event="disconnected")
        assert line.detail["grant_id"] == seeded.grant.id
        assert line.detail["operator"] == "api-key" and line.detail["via"] == "console"
        assert line.detail["operator_auth"] == "api_key"
        again = await op.post(path, data={"csrf": token, "confirm": "yes"})
        assert again.status_code == 200 and "already gone" in again.text
        assert [r.detail["action"] for r in await store.audit.list(event="csrf_failed")] == ["revoke"] * 3


async def test_cancel_ends_the_elicitation_for_its_agent(deploy_with: Deploy, database_url: str) -> None:
    async with seeded_console(deploy_with, CONNECTOR_DATABASE__URL=database_url) as seeded, seeded.operator() as op:
        path = f"/admin/elicitations/{seeded.elicitation_id}/cancel"
        token = csrf_of((await op.get(path)).text)
        done = await op.post(path, data={"csrf": token, "confirm": "yes"})
        assert done.status_code == 200 and "was cancelled" in done.text
        async with httpx.AsyncClient(
            base_url=seeded.base_url, headers={"Authorization": f"Bearer {seeded.agent_key}"}
        ) as api:
            state = (await api.get(f"/v1/elicitations/{seeded.elicitation_id}")).json()
        assert state["status"] == "cancelled"
        store = seeded.deployment.connector.runtime.store
        [line] = await store.audit.list(elicitation_id=seeded.elicitation_id, event="cancelled")
        assert line.detail["operator"] == "api-key" and line.detail["cause"] == "operator"
        again = await op.post(path, data={"csrf": token, "confirm": "yes"})
        assert "already ended" in again.text
        assert "It has already ended" in (await op.get(path)).text


async def test_rotating_a_secret_shows_the_new_one_once(deploy_with: Deploy) -> None:
    async with seeded_console(deploy_with) as seeded, seeded.operator() as op:
        runtime = seeded.deployment.connector.runtime
        path = f"/admin/webhooks/{seeded.endpoint.id}/rotate"
        token = csrf_of((await op.get(path)).text)
        assert (await op.post(path, data={"csrf": token, "confirm": "yes", "overlap": "999999999"})).status_code == 400
        done = await op.post(path, data={"csrf": token, "confirm": "yes", "overlap": "60"})
        assert done.status_code == 200
        endpoint = await runtime.store.webhooks.endpoint(seeded.endpoint.id)
        assert endpoint is not None
        secret = runtime.webhooks.secret_of(endpoint)
        assert secret in done.text and seeded.webhook_secret not in done.text
        assert runtime.webhooks.signing_secrets(endpoint, datetime.now(UTC)) == [secret, seeded.webhook_secret]
        listing = await op.get(f"/admin/webhooks/{seeded.endpoint.id}")
        assert secret not in listing.text and "previous secret signs too" in listing.text
        [line] = await runtime.store.audit.list(event="webhook_secret_rotated")
        assert line.detail["operator"] == "api-key" and line.detail["overlap_seconds"] == 60


async def test_lists_page_by_keyset(deploy_with: Deploy, database_url: str) -> None:
    async with (
        seeded_console(deploy_with, CONNECTOR_ADMIN__PAGE_SIZE="7", CONNECTOR_DATABASE__URL=database_url) as seeded,
        seeded.operator() as op,
    ):
        store = seeded.deployment.connector.runtime.store
        base = datetime.now(UTC) - timedelta(days=1)
        for i in range(20):  # several share one instant: ids break the ties
            at = base + timedelta(minutes=i // 3)
            await store.grants.upsert(
                GrantRecord(
                    new_id(16),
                    Identity("https://idp.test", f"u{i}"),
                    "github",
                    f"a{i}",
                    ("read",),
                    "k1",
                    b"x",
                    None,
                    at,
                    at,
                )
            )
            await store.audit.record("refreshed", provider="github", detail={"n": i}, now=at)
        seen: list[str] = []
        path: str | None = "/admin/grants"
        pages = 0
        while path is not None:
            page = await op.get(path)
            assert page.status_code == 200
            found = [line for line in page.text.splitlines() if '/revoke">Revoke' in line]
            seen += [line.split("/admin/grants/")[1].split("/")[0] for line in found]
            pages += 1
            nxt = [line for line in page.text.splitlines() if "Next page" in line]
            path = nxt[0].split('href="')[1].split('"')[0].replace("&amp;", "&") if nxt else None
        assert pages == 3 and len(seen) == 21 == len(set(seen))
        everything = await store.console.grants(GrantFilter(), after=None, limit=100)
        stored = sorted(everything.items, key=lambda g: (g.updated_at, g.id), reverse=True)
        assert seen == [g.id for g in stored]
        # The CSV export walks every page of a filter.
        export = await op.get("/admin/audit.csv?event=refreshed")
        assert export.status_code == 200 and export.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(export.text)))
        assert sorted(json.loads(r["detail"])["n"] for r in rows) == list(range(20))
        window = (base + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M")
        until = (base + timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M")
        rows = list(
            csv.DictReader(
                io.StringIO((await op.get(f"/admin/audit.csv?event=refreshed&since={window}&until={until}")).text)
            )
        )
        assert sorted(json.loads(r["detail"])["n"] for r in rows) == [6, 7, 8, 9, 10, 11]


async def test_the_console_on_its_own_listener(deploy_with: Deploy) -> None:
    from service.app import build_admin_app
    from service.web.server import listening_socket, serving

    port = free_port()
    async with seeded_console(deploy_with, CONNECTOR_ADMIN__PORT=str(port)) as seeded:
        async with seeded.operator() as public:
            assert (await public.get("/admin")).status_code == 404  # not on the public listener
        app = build_admin_app(seeded.deployment.connector.runtime)
        assert app is not None
        with listening_socket("127.0.0.1", port) as sock:
            async with (
                serving(app, sock),
                httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
                ) as internal,
            ):
                assert (await internal.get("/admin")).status_code == 200
                assert (await internal.get("/static/style.css")).status_code == 200
                assert (await internal.get("/v1/openapi.json")).status_code == 404
                assert (await internal.get("/admin", headers={"Authorization": ""})).status_code == 401


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"CONNECTOR_ADMIN__ENABLED": "true"}, "api_key"),
        ({"CONNECTOR_ADMIN__ENABLED": "true", "CONNECTOR_ADMIN__API_KEY": "short"}, "too short"),
        (
            {
                "CONNECTOR_ADMIN__ENABLED": "true",
                "CONNECTOR_ADMIN__OIDC_DISCOVERY_URL": "https://idp.example/.well-known/openid-configuration",
                "CONNECTOR_ADMIN__OIDC_CLIENT_ID": "console",
            },
            "allowed_users",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused(env: dict[str, str], problem: str) -> None:
    from service.config import load_settings
    from service.core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_settings(None, env=env)
    assert problem in str(caught.value)
    assert "short" not in str(caught.value).replace("too short", "")


async def test_the_overview_counts_are_a_snapshot_of_bounded_age(deploy_with: Deploy) -> None:
    async with (
        seeded_console(deploy_with, CONNECTOR_ADMIN__COUNTS_MAX_AGE_SECONDS="30") as seeded,
        seeded.operator() as op,
    ):
        runtime = seeded.deployment.connector.runtime
        assert "1 grants in all" in (await op.get("/admin")).text
        assert "<td>1</td>" in (await op.get("/admin/keys")).text
        now = datetime.now(UTC)
        await runtime.store.grants.upsert(
            GrantRecord(
                new_id(16), Identity("https://idp.test", "u2"), "github", "a2", ("read",), "k1", b"x", None, now, now
            )
        )
        assert "1 grants in all" in (await op.get("/admin")).text  # counted less than 30 s ago
        runtime.clock.advance(timedelta(seconds=31))
        assert "1 grants in all" in (await op.get("/admin")).text  # the stale count at once; a recount starts
        for _ in range(100):
            if "2 grants in all" in (await op.get("/admin")).text:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the overview was never recounted")
        assert "<td>1</td>" in (await op.get("/admin/keys")).text  # its own snapshot, stale: shown at once
