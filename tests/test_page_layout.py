"""The pages at phone width, in a real browser: Debian's Chromium (Playwright) at 320, 360 and 400 px.

Every page a user meets (start page, consent page, a problem page, the connected page) must keep its card inside
the screen with a margin on both sides, and nothing may scroll sideways.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from service.testing import MockOAuthProvider

from .conftest import deploy, write_catalog

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
WIDTHS = (320, 360, 400)
MIN_MARGIN = 8  # px of page background on each side of the card

playwright_api = pytest.importorskip("playwright.async_api", reason="Playwright (pip package) is not installed")
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"real-browser tests need Debian's chromium at {CHROMIUM}", allow_module_level=True)

MEASURE = """() => {
  const card = document.querySelector('.card').getBoundingClientRect();
  const wide = [...document.querySelectorAll('.card *')].filter(e => e.getBoundingClientRect().right > card.right + 0.5)
                 .map(e => e.tagName + '.' + e.className);
  return {viewport: window.innerWidth, scroll: document.documentElement.scrollWidth,
          left: card.left, right: card.right, overflowing: wide};
}"""


@pytest.mark.duration(6)
async def test_pages_keep_their_margins_at_phone_width(
    connector_env: dict[str, str], tmp_path: Path, loopback_socket: socket.socket, mock_provider: MockOAuthProvider
) -> None:
    async with mock_provider.serve_http():
        catalog = write_catalog(tmp_path / "http_providers.toml", {"github": mock_provider.catalog_entry()})
        overrides = {"CONNECTOR_PROVIDERS__CATALOG": str(catalog), "CONNECTOR_DEMO": "true"}
        async with (
            deploy(connector_env, tmp_path, mock_provider, loopback_socket, None, **overrides) as deployment,
            playwright_api.async_playwright() as pw,
        ):
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            problems: list[str] = []
            for width in WIDTHS:
                page = await browser.new_page(viewport={"width": width, "height": 720})

                async def check(name: str, page=page, width=width) -> None:  # type: ignore[no-untyped-def]
                    m = await page.evaluate(MEASURE)
                    if m["scroll"] > m["viewport"]:
                        problems.append(f"{name} at {width}px scrolls sideways ({m['scroll']}px wide)")
                    if m["left"] < MIN_MARGIN or m["viewport"] - m["right"] < MIN_MARGIN:
                        problems.append(f"{name} at {width}px: card at {m['left']:.0f}..{m['right']:.0f}px")
                    if m["overflowing"]:
                        problems.append(f"{name} at {width}px: {m['overflowing']} stick out of the card")

                await page.goto(f"{deployment.base_url}/")
                await check("start page")
                await page.get_by_role("link", name="Start a demo authorization").click()
                await page.wait_for_load_state()
                assert "/connect/" in page.url
                await check("consent page")
                await page.get_by_role("button", name="Continue to Mock Provider").click()
                await page.wait_for_load_state()
                assert await page.locator("h1").inner_text() == "Connected"
                await check("connected page")
                await page.goto(f"{deployment.base_url}/connect/{'x' * 40}")
                await check("problem page")
                await page.close()
            await browser.close()
    assert problems == []
