"""What a person in the browser reads: a plain sentence for every outcome, a reference only for problems, and `/`
(what this is; on loopback its version, providers and, in demo mode, a link through a whole flow)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from service import ConfigError, load_settings
from service.config import ServerSettings, Settings
from service.testing import ScriptedBrowser
from service.version import __version__
from service.web.errors import REFUSALS, sentence

from .conftest import Deploy, Deployment
from .flow_support import asking

# What the raising code puts in `detail` for the sentences that name it.
SAMPLE_DETAIL = {"problem": "the id is too long", "error": "server error", "limit": "65536", "expected": "form"}


@pytest.mark.parametrize("code", sorted(REFUSALS))
def test_every_refusal_reads_as_a_sentence(code: str) -> None:
    text = sentence(code, SAMPLE_DETAIL)
    refusal = REFUSALS[code]
    assert text[0].isupper() and text.endswith((".", "?")), text
    assert "{" not in text and "}" not in text
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", text), f"a raw code in the sentence: {text}"
    assert "CONNECTOR_" not in text and "config" not in text.lower(), f"operator details in the sentence: {text}"
    assert refusal.title and refusal.title[0].isupper()


async def test_a_finished_flow_says_so_plainly_and_shows_no_code(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        done = await browser.authorize(pending.url)
        assert done.status_code == 200 and "is connected" in done.text
        again = await browser.get(pending.url)
    assert again.headers["x-connector-error"] == "already_completed"
    assert "You are connected" in again.text and "nothing more to do" in again.text
    assert "already_completed" not in again.text and "reference" not in again.text


async def test_a_problem_page_gives_a_reference_with_the_request_id(deployment: Deployment) -> None:
    async with ScriptedBrowser() as browser:
        page = await browser.get(f"{deployment.base_url}/connect/no-such-link")
    assert page.status_code == 404
    assert f"<code>unknown_elicitation · {page.headers['x-request-id']}</code>" in page.text


async def test_home_on_loopback_shows_version_and_providers_and_no_demo_by_default(deployment: Deployment) -> None:
    async with ScriptedBrowser() as browser:
        home = await browser.get(f"{deployment.base_url}/")
        start = await browser.get(f"{deployment.base_url}/demo/start")
    assert home.status_code == 200 and "ACP OAuth connector" in home.text
    assert f"Version {__version__}" in home.text and "Mock Provider" in home.text and "ready" in home.text
    assert "/demo/start" not in home.text and "Demo mode" not in home.text
    assert start.status_code == 404  # no demo route outside demo mode


async def test_home_on_a_public_deployment_says_what_it_is_and_nothing_about_its_setup(deploy_with: Deploy) -> None:
    public = {
        "CONNECTOR_PUBLIC_BASE_URL": "https://connector.example.com",
        "CONNECTOR_IDENTITY__LOCAL__UNSAFE_ALLOW_REMOTE": "true",
    }
    async with deploy_with(**public) as deployment, ScriptedBrowser() as browser:
        home = await browser.get(f"http://127.0.0.1:{deployment.connector.settings.server.port}/")
    assert home.status_code == 200 and "ACP OAuth connector" in home.text
    assert __version__ not in home.text and "Mock Provider" not in home.text and "/demo/start" not in home.text


async def test_the_demo_link_walks_through_a_whole_flow(deploy_with: Deploy) -> None:
    async with deploy_with(CONNECTOR_DEMO="true") as deployment, ScriptedBrowser() as browser:
        home = await browser.get(f"{deployment.base_url}/")
        assert "Demo mode" in home.text and 'href="/demo/start"' in home.text
        started = await browser.get(f"{deployment.base_url}/demo/start")
        assert started.status_code == 303 and started.headers["location"].startswith("/connect/")
        consent = await browser.follow(started)
        assert consent.status_code == 200 and "Connect your Mock Provider account" in consent.text
        done = await browser.follow(await browser.submit(consent, "continue"))
        assert done.status_code == 200 and "Your Mock Provider account octocat is connected" in done.text
        assert 'href="/"' in done.text  # back to the demo's start page
        grant = await deployment.connector.find_grant(deployment.local_user, "github")
    assert grant is not None


def test_the_demo_is_refused_off_loopback_and_without_the_local_verifier(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ConfigError) as off_loopback:
        load_settings(env={"CONNECTOR_DEMO": "true", "CONNECTOR_SERVER__HOST": "0.0.0.0"})  # noqa: S104
    assert off_loopback.value.key == "demo" and "loopback" in off_loopback.value.problem
    with pytest.raises(ConfigError) as other_verifier:
        load_settings(env={"CONNECTOR_DEMO": "true", "CONNECTOR_IDENTITY__VERIFIER": "oidc"})
    assert other_verifier.value.key == "demo" and "local verifier" in other_verifier.value.problem


def test_settings_with_an_unreachable_demo_are_never_built_however_they_are_made() -> None:
    """The one check: a `Settings` built directly (as an embedding program may) refuses the demo as the loader does,
    so nothing after it (the runtime, the web app) has to check again."""
    with pytest.raises(ValidationError) as off_loopback:
        Settings(demo=True, server=ServerSettings(host="0.0.0.0"))  # noqa: S104
    (error,) = off_loopback.value.errors()
    assert error["loc"] == ("demo",) and "loopback" in error["msg"]
    assert Settings(demo=True).demo  # on loopback with the local verifier it is allowed


async def test_the_demo_with_a_provider_elsewhere_does_not_say_nothing_leaves_the_machine(deploy_with: Deploy) -> None:
    # The provider here signs in at github.mock-provider.test, not on loopback: as real credentials would.
    async with deploy_with(CONNECTOR_DEMO="true") as deployment, ScriptedBrowser() as browser:
        home = await browser.get(f"{deployment.base_url}/")
    assert "Demo mode" in home.text and "nothing leaves this machine" not in home.text
    assert "with a real" in home.text and "account" in home.text
