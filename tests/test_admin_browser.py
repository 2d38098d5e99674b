"""The operator console in Chromium with its Content Security Policy enforced: an operator signs in at a conformant
OpenID Provider (panva's oidc-provider, its own process: tests/oidc_op) as a member of the allowed group, opens
every page (each scanned by axe-core: no serious or critical violation), revokes a grant and cancels an elicitation
through the confirmation forms; someone outside the group is refused."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from .admin_support import csrf_of, seeded_console
from .chromium_support import CHROMIUM, FLAGS
from .conftest import Deploy
from .oidc_op_support import OidcOp

playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"real-browser tests need Debian's chromium at {CHROMIUM}", allow_module_level=True)

AXE = Path(__file__).resolve().parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"
GROUP = "connector-operators"


def op_config(base_url: str) -> dict[str, Any]:
    return {
        "clients": [
            {
                "client_id": "connector-console",
                "token_endpoint_auth_method": "none",
                "redirect_uris": [f"{base_url}/admin/login/callback"],
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
            }
        ],
        "accounts": {
            "ops-alice": {"email": "alice@ops.test", "email_verified": True, "groups": [GROUP, "staff"]},
            "mallory": {"email": "mallory@ops.test", "email_verified": True, "groups": ["staff"]},
        },
        "login_account": "ops-alice",
        "claims": {"openid": ["sub"], "email": ["email", "email_verified"], "groups": ["groups"]},
    }


@pytest.fixture
async def op(connector_env: dict[str, str]) -> AsyncIterator[OidcOp]:
    async with OidcOp.start(op_config(connector_env["CONNECTOR_PUBLIC_BASE_URL"])) as running:
        yield running


def sign_in_env(op: OidcOp) -> dict[str, str]:
    return {
        "CONNECTOR_ADMIN__OIDC_DISCOVERY_URL": op.discovery_url,
        "CONNECTOR_ADMIN__OIDC_CLIENT_ID": "connector-console",
        "CONNECTOR_ADMIN__OIDC_SCOPES": "openid email groups",
        "CONNECTOR_ADMIN__ALLOWED_GROUPS": GROUP,
    }


async def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page (injected through the DevTools protocol: the page's
    CSP allows no script of its own)."""
    await page.evaluate(AXE.read_text())
    found = await page.evaluate(
        "async () => (await axe.run(document)).violations"
        ".map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' '))}))"
    )
    return [v for v in found if v["impact"] in ("serious", "critical")]


async def test_an_operator_signs_in_and_works_in_chromium(deploy_with: Deploy, op: OidcOp, tmp_path: Path) -> None:
    if not AXE.exists():
        pytest.skip("axe-core is not installed: make tests/axe/node_modules/.installed")
    async with seeded_console(deploy_with, **sign_in_env(op)) as seeded:
        store = seeded.deployment.connector.runtime.store
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            context = await browser.new_context()
            page = await context.new_page()
            csp: list[str] = []
            page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

            stranger = await page.goto(f"{seeded.base_url}/admin")
            assert stranger is not None and stranger.status == 401
            assert "Sign-in required" in await page.locator("h1").inner_text()

            await page.goto(f"{seeded.base_url}/admin/login")
            await page.wait_for_url(f"{seeded.base_url}/admin")
            assert "Operator: alice@ops.test" in await page.inner_text("header")
            session = [c for c in await context.cookies() if c["name"] == "connector-admin"]
            assert session and session[0]["httpOnly"] and session[0]["sameSite"] == "Lax"

            report: dict[str, list[dict[str, Any]]] = {}
            for path, heading in (
                ("/admin", "Overview"),
                ("/admin/grants", "Grants"),
                ("/admin/elicitations", "Elicitations"),
                ("/admin/audit", "Audit"),
                ("/admin/webhooks", "Webhooks"),
                (f"/admin/webhooks/{seeded.endpoint.id}", "Webhook deliveries"),
                ("/admin/keys", "Vault keys"),
                (f"/admin/grants/{seeded.grant.id}/revoke", "Revoke a grant"),
                (f"/admin/elicitations/{seeded.elicitation_id}/cancel", "Cancel an elicitation"),
                (f"/admin/webhooks/{seeded.endpoint.id}/rotate", "Rotate a webhook secret"),
            ):
                response = await page.goto(seeded.base_url + path)
                assert response is not None and response.status == 200, path
                assert await page.locator("h1").inner_text() == heading
                report[path] = await axe_violations(page)
            (tmp_path / "axe.json").write_text(json.dumps(report, indent=2))
            assert all(not found for found in report.values()), json.dumps(report, indent=2)

            # The session's forms need the session's token: none, or one made for the operator API key, is refused.
            revoke = f"{seeded.base_url}/admin/grants/{seeded.grant.id}/revoke"
            async with seeded.operator() as op:
                other_session = csrf_of((await op.get(revoke)).text)
            for form in ({"confirm": "yes"}, {"csrf": other_session, "confirm": "yes"}):
                refused = await context.request.post(revoke, form=form)
                assert refused.status == 403 and refused.headers["x-connector-error"] == "operator_csrf_failed"
            assert await store.grants.get(seeded.grant.id) is not None

            # Revoke: the link on the list, the confirmation page, its button.
            await page.goto(f"{seeded.base_url}/admin/grants")
            await page.get_by_role("link", name=f"Revoke grant {seeded.grant.id}").click()
            await page.get_by_role("button", name="Revoke").click()
            await page.wait_for_load_state()
            assert await page.locator("h1").inner_text() == "Grant revoked"
            assert await store.grants.get(seeded.grant.id) is None
            [line] = await store.audit.list(event="disconnected")
            assert line.detail["operator"] == "alice@ops.test" and line.detail["operator_auth"] == "oidc"

            # Cancel, the same way.
            await page.goto(f"{seeded.base_url}/admin/elicitations")
            await page.get_by_role("link", name=f"Cancel elicitation {seeded.elicitation_id}").click()
            await page.get_by_role("button", name="Cancel the elicitation").click()
            await page.wait_for_load_state()
            assert await page.locator("h1").inner_text() == "Elicitation cancelled"
            record = await store.elicitations.get(seeded.elicitation_id)
            assert record is not None and record.status.value == "cancelled"
            [line] = await store.audit.list(elicitation_id=seeded.elicitation_id, event="cancelled")
            assert line.detail["operator"] == "alice@ops.test"
            assert [r.detail["operator"] for r in await store.audit.list(event="operator_signed_in")] == [
                "alice@ops.test"
            ]
            await page.screenshot(path=str(tmp_path / "cancelled.png"))

            # Sign out: the session is gone, the console answers 401 again.
            await page.get_by_role("button", name="Sign out").click()
            await page.wait_for_load_state()
            again = await page.goto(f"{seeded.base_url}/admin")
            assert again is not None and again.status == 401
            assert csp == []

            # A session lasts admin.session_seconds: signed in again, then past it, the console answers 401.
            await page.goto(f"{seeded.base_url}/admin/login")
            await page.wait_for_url(f"{seeded.base_url}/admin")
            seeded.deployment.connector.runtime.clock.advance(timedelta(seconds=3601))
            expired = await page.goto(f"{seeded.base_url}/admin")
            assert expired is not None and expired.status == 401
            await browser.close()


async def test_someone_outside_the_allowed_group_is_refused(deploy_with: Deploy, op: OidcOp) -> None:
    await op.set_login_account("mallory")
    async with seeded_console(deploy_with, **sign_in_env(op)) as seeded:
        store = seeded.deployment.connector.runtime.store
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = await (await browser.new_context()).new_page()
            await page.goto(f"{seeded.base_url}/admin/login")
            await page.wait_for_url(f"{seeded.base_url}/admin/login/callback*")
            assert await page.locator("h1").inner_text() == "Not an operator"
            response = await page.goto(f"{seeded.base_url}/admin")
            assert response is not None and response.status == 401
            await browser.close()
        [refused] = await store.audit.list(event="operator_sign_in_refused")
        assert refused.detail["operator"] == "mallory@ops.test"
        assert await store.audit.list(event="operator_signed_in") == []
