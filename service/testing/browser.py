"""A scripted browser for tests: keeps cookies, reads forms, follows the OAuth redirects one by one.

It behaves like a user at a real browser who opens the connect link, presses Continue or Decline,
and lets the provider (usually a `MockOAuthProvider`) redirect back. Every response is recorded.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

import httpx


class _FormParser(HTMLParser):
    """The first form's action and what it sends: its inputs, a radio button or checkbox only when checked."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.marks: set[str] = set()  # the form's attributes (e.g. data-mock-provider-sign-in)
        self.fields: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and self.action is None:
            self.action = a.get("action", "")
            self.marks = set(a)
        elif tag == "input" and a.get("name"):
            if a.get("type") in ("radio", "checkbox") and "checked" not in a:
                return
            self.fields.setdefault(a["name"], []).append(a.get("value", ""))


class ScriptedBrowser:
    def __init__(self, **client_kwargs: Any) -> None:
        self.client = httpx.AsyncClient(follow_redirects=False, timeout=15.0, **client_kwargs)
        self.responses: list[httpx.Response] = []

    async def __aenter__(self) -> ScriptedBrowser:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def get(self, url: str) -> httpx.Response:
        response = await self.client.get(url)
        self.responses.append(response)
        return response

    async def submit(self, page: httpx.Response, action: str, **fields: str | list[str]) -> httpx.Response:
        """Press the button named `action` on the page's form, with `fields` changed (e.g. `scope=["read:user"]`
        unticks the other scopes on the mock provider's sign-in page)."""
        parser = _form(page)
        response = await self.client.post(
            urljoin(str(page.url), parser.action or ""), data={**parser.fields, **fields, "action": action}
        )
        self.responses.append(response)
        return response

    async def follow(self, response: httpx.Response, *, limit: int = 8) -> httpx.Response:
        """Follow redirects (to the provider and back) as a browser would; at the mock provider's sign-in page
        the user approves as offered (the first user, every scope), as a person pressing Approve would."""
        for _ in range(limit):
            if response.status_code == 200 and is_mock_sign_in(response):
                response = await self.submit(response, "approve")
            if response.status_code not in (301, 302, 303, 307, 308):
                return response
            response = await self.get(urljoin(str(response.url), response.headers["location"]))
        raise AssertionError("too many redirects")

    async def authorize(self, connect_url: str, **fields: str) -> httpx.Response:
        """The whole happy path: open the link, press Continue (with the consent form's `fields` changed, e.g.
        `account_label="work"`), go through the provider, land on our page."""
        page = await self.get(connect_url)
        if page.status_code != 200:
            return page
        return await self.follow(await self.submit(page, "continue", **fields))

    def transcript(self, host: str | None = None) -> str:
        """What the servers answered (status, headers, body), optionally only those of `host`, for scanning.

        Request URLs are left out on purpose: the provider's redirect to the callback carries the code by design.
        """
        parts = []
        for r in self.responses:
            if host is None or r.request.url.host == host:
                parts.append(f"{r.status_code}\n{r.headers}\n{r.text}")
        return "\n".join(parts)


def _form(page: httpx.Response) -> _FormParser:
    parser = _FormParser()
    parser.feed(page.text)
    if parser.action is None:
        raise AssertionError(f"no form on the page at {page.url}")
    return parser


def is_mock_sign_in(page: httpx.Response) -> bool:
    """Whether `page` is the mock provider's sign-in page (`MockOAuthProvider(sign_in_page=True)`)."""
    if "text/html" not in page.headers.get("content-type", ""):
        return False
    parser = _FormParser()
    parser.feed(page.text)
    return "data-mock-provider-sign-in" in parser.marks
