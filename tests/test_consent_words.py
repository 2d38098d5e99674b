"""What the consent and result pages tell a person: what each scope gives (from the catalog), who is asking and what
the agent said, which account the link is for and until when; after the provider, which account is connected, at
an address without the provider's code and state, told only to the browser that did it."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from urllib.parse import urljoin

import httpx

from service import Identity
from service.providers.entry import OPENID_SCOPE_DESCRIPTIONS, ProviderEntry
from service.testing import ScriptedBrowser
from service.web.browser import expiry_words, identity_hint

from .conftest import Deploy
from .flow_support import asking

REPO_WORDS = "Full access to your public and private repositories."


def text_of(page: httpx.Response) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text)))


async def test_the_consent_page_says_what_each_scope_gives_who_asks_and_for_whom(deploy_with: Deploy) -> None:
    user = Identity("https://login.example.com", "alice.smith@example.com")
    described = json.dumps({"repo": REPO_WORDS})
    async with (
        deploy_with(user=user, CONNECTOR_PROVIDERS__GITHUB__SCOPE_DESCRIPTIONS=described) as deployment,
        asking(deployment) as ask,
        ScriptedBrowser() as browser,
    ):
        pending = await ask(scopes=("repo", "admin:org_hook"), message="I need your repositories to list them.")
        page = await browser.get(pending.url)
        record = await deployment.connector.runtime.store.elicitations.get(pending.elicitation_id)
    assert page.status_code == 200 and record is not None
    text = text_of(page)
    assert f"repo {REPO_WORDS}" in text
    assert "admin:org_hook (no description in this connector's catalog: Mock Provider shows what it means)" in text
    assert f"{record.agent_name} says: I need your repositories to list them." in text
    # The account the link is for, recognisable by its owner and not spelled out to whoever holds the link.
    assert "This link is for al…@example.com at login.example.com" in text
    assert "alice.smith" not in text
    assert f"It expires at {record.expires_at.astimezone(UTC):%H:%M} UTC (in " in text


def test_openid_scopes_are_described_for_openid_entries_and_the_catalog_wins() -> None:
    oidc = ProviderEntry("op", oidc=True, scope_descriptions={"email": "Your work address."})
    assert oidc.describe_scope("email") == "Your work address."
    assert oidc.describe_scope("offline_access") == OPENID_SCOPE_DESCRIPTIONS["offline_access"]
    assert ProviderEntry("plain").describe_scope("email") is None  # `email` means something else elsewhere
    assert ProviderEntry("plain").describe_scope("repo") is None


def test_hints_and_expiry_in_words() -> None:
    assert identity_hint(Identity("https://idp.example.com/tenant", "bob")) == "b… at idp.example.com"
    assert identity_hint(Identity("local", "alice.smith@example.com")) == "al…@example.com at local"
    now = datetime(2026, 12, 4, 22, 0, tzinfo=UTC)
    assert expiry_words(now + timedelta(minutes=10, seconds=10), now) == "22:10 UTC (in 10 minutes)"
    assert expiry_words(now + timedelta(seconds=61), now) == "22:01 UTC (in 1 minute)"
    assert expiry_words(now + timedelta(seconds=20), now) == "22:00 UTC (in less than a minute)"


async def test_after_the_provider_a_clean_address_names_the_account_once_and_only_to_that_browser(
    deploy_with: Deploy,
) -> None:
    async with deploy_with() as deployment, asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        consent = await browser.get(pending.url)
        callback = await browser.submit(consent, "continue")
        while "/callback/github?" not in str(callback.url):  # to the provider and back to its redirect
            callback = await browser.get(urljoin(str(callback.url), callback.headers["location"]))
        assert callback.status_code == 303
        location = callback.headers["location"]
        assert location == f"/connect/{pending.elicitation_id}/done"  # nothing of the redirect's query
        (cookie,) = [c for c in browser.client.cookies.jar if c.name == "connector-result"]
        assert cookie.path == location and "octocat" not in (cookie.value or "")  # encrypted, on that path only

        # Another browser holding the very same cookie, but not this browser's binding: told nothing.
        async with ScriptedBrowser() as other:
            other.client.cookies.set("connector-result", cookie.value or "", path=location)
            stolen = await other.get(f"{deployment.base_url}{location}")
        assert "octocat" not in stolen.text and "Connected" not in stolen.text

        done = await browser.follow(callback)
        assert str(done.url) == f"{deployment.base_url}{location}"
        assert "Your Mock Provider account octocat is connected" in text_of(done)
        assert "connector-result=" in done.headers["set-cookie"] and "Max-Age=0" in done.headers["set-cookie"]
        again = await browser.get(f"{deployment.base_url}{location}")  # a reload: told once
        assert again.status_code == 200 and "octocat" not in again.text
        assert (await pending.outcome()).ok


async def test_a_refused_callback_answers_at_a_clean_address_with_its_status_once(deploy_with: Deploy) -> None:
    async with deploy_with() as deployment, asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        callback = await browser.submit(await browser.get(pending.url), "continue")
        while "/callback/github?" not in str(callback.url):
            callback = await browser.get(urljoin(str(callback.url), callback.headers["location"]))
        await browser.follow(callback)  # connected
        replayed = await browser.get(str(callback.url))  # the provider's redirect again: its code is spent
        assert replayed.status_code == 303
        location = replayed.headers["location"]
        assert re.fullmatch(r"/callback/github/failed/[\w-]{16}", location)  # nothing of the redirect's query
        request_id = replayed.headers["x-request-id"]
        (cookie,) = [c for c in browser.client.cookies.jar if c.name == "connector-failure"]
        assert cookie.path == location

        async with ScriptedBrowser() as other:  # the same cookie in a browser without this one's binding
            other.client.cookies.set("connector-failure", cookie.value or "", path=location)
            stolen = await other.get(f"{deployment.base_url}{location}")
        assert stolen.status_code == 200 and "x-connector-error" not in stolen.headers

        failed = await browser.follow(replayed)
        assert str(failed.url) == f"{deployment.base_url}{location}"
        assert failed.status_code == 400 and failed.headers["x-connector-error"] == "state_used"
        assert f"state_used · {request_id}" in text_of(failed)  # the reference names the callback's request
        again = await browser.get(f"{deployment.base_url}{location}")  # a reload: told once
        assert again.status_code == 200 and "x-connector-error" not in again.headers

        # A callback this deployment never started, from a browser it never saw: the same clean address.
        async with ScriptedBrowser() as stranger:
            unknown = await stranger.get(f"{deployment.base_url}/callback/github?state=nosuchstate&code=abc")
            assert unknown.status_code == 303 and unknown.headers["location"].startswith("/callback/github/failed/")
            page = await stranger.follow(unknown)
        assert page.status_code == 400 and page.headers["x-connector-error"] == "unknown_state"
