"""An API key typed in Chromium, with the pages' CSP enforced (issue 26, "Done when"): asked by an embedded agent
over the official ACP SDK client and through `/v1`; the check request at a mock API on loopback; the agent's next
call through `http()` and `/v1/proxy` carries the key; exactly one `elicitation/complete`. A wrong key, a malformed
key and a check that times out each leave a sentence on the page and nothing stored. A stranger with the link sees
no form. Then everything is scanned for the typed key: the ACP wire, the logs, every page, the API answers, the
database file and Chromium's own history; it is found nowhere (the database holds only its ciphertext)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service import Identity
from service.testing import MockKeyedApi

from .api_support import api_client, make_key, user_headers
from .chromium_support import CHROMIUM, FLAGS
from .conftest import Deployment
from .credential_support import KEYED, keyed_connector
from .flow_support import asking, assert_nothing_stored

playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"real-browser tests need Debian's chromium at {CHROMIUM}", allow_module_level=True)

pytestmark = pytest.mark.duration(40)


class Chromium:
    """One Chromium profile on disk (so its history file can be read afterwards), its pages' text and CSP
    complaints."""

    def __init__(self, context: Any, profile: Path) -> None:
        self.context = context
        self.profile = profile
        self.pages_seen: list[str] = []
        self.csp_blocked: list[str] = []

    async def page(self) -> Any:
        page = await self.context.new_page()
        page.on("console", lambda m: self.csp_blocked.append(m.text) if "Content Security Policy" in m.text else None)
        return page

    async def keep(self, page: Any) -> str:
        html: str = await page.content()
        self.pages_seen.append(html)
        return html

    def history_bytes(self) -> bytes:
        """Every file of the profile that keeps the history, visited links and sessions."""
        found = b""
        for path in self.profile.rglob("*"):
            if path.is_file() and any(part in path.name for part in ("History", "Visited", "Session", "Current")):
                found += path.read_bytes()
        return found


@pytest.fixture
async def chromium(tmp_path: Path) -> AsyncIterator[Chromium]:
    profile = tmp_path / "chromium-profile"
    async with playwright_api.async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=FLAGS)
        browser = Chromium(context, profile)
        try:
            yield browser
        finally:
            await context.close()


deployment = keyed_connector  # every test here runs on the deployment with the keyed entry


async def open_form(browser: Chromium, url: str) -> Any:
    """The connect page in Chromium, Continue pressed: the credential form (the local verifier knows the user)."""
    page = await browser.page()
    response = await page.goto(url)
    assert response is not None and response.status == 200
    await browser.keep(page)
    await page.get_by_role("button", name="Continue").click()
    await page.wait_for_url("**/credentials?ticket=*")
    html = await browser.keep(page)
    field = page.locator("input[name=api_key]")
    assert await field.get_attribute("type") == "password" and await field.get_attribute("autocomplete") == "off"
    assert 'autocomplete="off"' in html
    return page


async def type_and_submit(browser: Chromium, page: Any, key: str) -> str:
    await page.locator("input[name=api_key]").fill(key)
    await page.get_by_role("button", name="Connect").click()
    await page.wait_for_load_state()
    return await browser.keep(page)


async def test_embedded_over_the_acp_sdk_then_v1_the_key_is_typed_used_and_found_nowhere(
    deployment: Deployment,
    keyed: MockKeyedApi,
    chromium: Chromium,
    captured_logs: pytest.LogCaptureFixture,
    connector_env: dict[str, str],
) -> None:
    connector, user = deployment.connector, deployment.local_user
    key = keyed.add_key({"id": "acct_chromium"})
    wires: list[list[tuple[str, dict[str, Any]]]] = []
    api_answers: list[str] = []
    async with asking(deployment) as ask:
        # 1. Bad attempts on one form: the provider refuses, the format is wrong, the check times out.
        pending = await ask(provider=KEYED, scopes=())
        wires.append(pending.wire.messages)
        page = await open_form(chromium, pending.url)
        refused = await type_and_submit(chromium, page, "mk_live_" + "9" * 32)
        assert "Keyed Mock API refused this key: invalid_api_key." in refused
        malformed = await type_and_submit(chromium, page, "sk_live_" + key[8:])
        assert "API key must start with mk_live_." in malformed
        keyed.check_timeouts = 1
        timed_out = await type_and_submit(chromium, page, key)
        assert "did not answer the check in time. Nothing was stored" in timed_out
        await assert_nothing_stored(deployment, pending)

        # 2. The right key: stored, one elicitation/complete, the page shows only its last four characters.
        connected = await type_and_submit(chromium, page, key)
        assert await page.locator("h1").inner_text() == "Connected"
        assert f"…{key[-4:]}" in connected
        assert (await pending.outcome()).ok
        assert [m["params"]["elicitationId"] for m in pending.wire.received("elicitation/complete")] == [
            pending.elicitation_id
        ]
        assert pending.client.completions == [pending.elicitation_id]
        assert chromium.csp_blocked == []

        # 3. The agent's next call through http() carries the key.
        async with connector.http(user, KEYED) as client:
            items = await client.get("/v1/items")
        assert items.status_code == 200 and keyed.presented[-1] == f"Bearer {key}"
        await page.close()

    # 4. Through /v1: a second key replaces the first (asked again), typed in Chromium; then /v1/proxy.
    second = keyed.add_key({"id": "acct_chromium"})
    api_key = await make_key(connector.runtime.store)
    async with api_client(deployment.base_url, api_key) as api:
        created = await api.post(
            "/v1/elicitations",
            json={
                "user": {"issuer": user.issuer, "subject": user.subject},
                "provider": KEYED,
                "scope": {"sessionId": "sess-2", "toolCallId": "call-2"},
                "askAgain": True,  # replace the stored key
            },
        )
        assert created.status_code == 201, created.text
        eid = created.json()["elicitationId"]
        answered = await api.post(f"/v1/elicitations/{eid}/answer", json={"action": "accept"})
        waiting = asyncio.create_task(api.get(f"/v1/elicitations/{eid}", params={"wait": "20"}))
        page = await open_form(chromium, created.json()["url"])
        await type_and_submit(chromium, page, second)
        assert await page.locator("h1").inner_text() == "Connected"
        state = await waiting
        assert state.json()["status"] == "completed", state.text
        proxied = await api.get(f"/v1/proxy/{KEYED}/v1/items", headers=user_headers(user))
        assert proxied.status_code == 200 and keyed.presented[-1] == f"Bearer {second}"
        grants = await api.get("/v1/grants", headers=user_headers(user))
        api_answers += [created.text, answered.text, state.text, proxied.text, json.dumps(dict(proxied.headers))]
        api_answers.append(grants.text)
    assert chromium.csp_blocked == []

    # 5. The scan: nowhere but in the grant's ciphertext.
    database = Path(connector_env["CONNECTOR_DATABASE__URL"].removeprefix("sqlite+aiosqlite:///"))
    stored = b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))
    await chromium.context.close()
    places = {
        "the ACP wire": json.dumps([m for messages in wires for m in messages]),
        "the logs": "\n".join(r.getMessage() + json.dumps(r.__dict__, default=str) for r in captured_logs.records),
        "the pages": "\n".join(chromium.pages_seen),
        "the API answers": "\n".join(api_answers),
        "the database file": stored.decode("latin-1"),
        "Chromium's history": chromium.history_bytes().decode("latin-1"),
    }
    assert stored and places["Chromium's history"]  # both were there to scan
    for typed in (key, second):
        for where, text in places.items():
            assert typed not in text and typed[8:] not in text, f"the key was found in {where}"


async def test_a_stranger_with_the_link_sees_no_form(
    deployment: Deployment, keyed: MockKeyedApi, chromium: Chromium
) -> None:
    bob = Identity(deployment.local_user.issuer, "bob")  # the link was made for Bob; the browser is Alice's
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=(), user=bob)
        page = await chromium.page()
        await page.goto(pending.url)
        await page.get_by_role("button", name="Continue").click()
        await page.wait_for_load_state()
        html = await chromium.keep(page)
        assert "/credentials" not in page.url and 'type="password"' not in html
        assert await page.locator("h1").inner_text() == "Different account"
        await assert_nothing_stored(deployment, pending)
    # The form's own address, opened in another browser profile than the one it was issued to: no form either.
    async with asking(deployment) as ask:
        pending = await ask(provider=KEYED, scopes=())
        form = await open_form(chromium, pending.url)
        async with playwright_api.async_playwright() as pw:  # a second Chromium, a clean profile
            clean = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            stranger = await (await clean.new_context()).new_page()
            answer = await stranger.goto(form.url)
            assert answer is not None and answer.status == 403
            assert 'type="password"' not in await stranger.content()
            await clean.close()
        await assert_nothing_stored(deployment, pending)
