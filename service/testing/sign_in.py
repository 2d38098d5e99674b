"""The mock provider's sign-in page: choose a user, approve or deny, untick scopes to narrow the grant.

What a real provider shows between the connector's redirect and the callback, so that a demo (`make run`) and the
tests that want it see the same steps. `MockOAuthProvider(sign_in_page=False)` (its default) skips it and consents
at once, for tests that want speed.

The page is HTML from a Jinja2 template with a CSP like the connect pages': nothing but its own inline style (by
hash) and a form that posts to the provider, whose answer redirects to the client's redirect URI, so that origin is
a form-action too (browsers apply form-action to the redirect a form post leads to).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STYLE = (
    "body{font:16px/1.5 system-ui,sans-serif;margin:0;background:#f4f1ea;color:#222}"
    ".card{max-width:32rem;margin:2rem auto;padding:1.5rem;background:#fff;border:1px solid #ddd;border-radius:8px}"
    "h1{font-size:1.4rem;margin:.5rem 0}.badge{display:inline-block;font-size:.8rem;padding:.1rem .5rem;"
    "background:#fff3c4;border-radius:4px;margin:0}fieldset{border:1px solid #ddd;border-radius:6px;margin:1rem 0}"
    "label{display:block;margin:.25rem 0}.actions{display:flex;gap:.5rem}button{font:inherit;padding:.5rem 1rem;"
    "border-radius:6px;border:1px solid #999;background:#fff}button.primary{background:#2d5b8a;color:#fff;"
    "border-color:#2d5b8a}code{overflow-wrap:anywhere}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()


@dataclass(frozen=True, slots=True)
class PendingSignIn:
    """An authorization request waiting at the page: everything needed to answer it once the user chose."""

    query: dict[str, str]  # the /authorize query as received (validated)
    scopes: tuple[str, ...]  # as requested


@dataclass
class SignInPages:
    """The requests waiting at the page, by the id the page's form carries (each answered once)."""

    pending: dict[str, PendingSignIn]

    @classmethod
    def empty(cls) -> SignInPages:
        return cls({})

    def open(self, query: dict[str, str]) -> str:
        """Keep `query` for the page's answer; the id its form posts back."""
        request_id = secrets.token_urlsafe(16)
        self.pending[request_id] = PendingSignIn(dict(query), tuple(query.get("scope", "").split()))
        return request_id

    def take(self, request_id: str) -> PendingSignIn | None:
        """The request the page answers (gone from then on), or None when unknown or already answered."""
        return self.pending.pop(request_id, None)


def page(
    *, provider_name: str, action: str, request_id: str, query: dict[str, str], users: list[dict[str, Any]]
) -> tuple[str, dict[str, str]]:
    """The page's HTML and its headers (CSP and the like) for one waiting request."""
    html = _template().render(
        provider_name=provider_name,
        action=action,
        request_id=request_id,
        client_id=query.get("client_id", ""),
        return_to=_origin(query.get("redirect_uri", "")),
        scopes=query.get("scope", "").split(),
        users=users,
        style=STYLE,
    )
    csp = (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self' "
        f"{_origin(query.get('redirect_uri', ''))}; frame-ancestors 'none'; base-uri 'none'"
    )
    headers = {
        "content-type": "text/html; charset=utf-8",
        "content-security-policy": csp,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-store",
    }
    return html, headers


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


@cache
def _template() -> Any:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    templates = Path(__file__).resolve().parent / "templates"
    environment = Environment(loader=FileSystemLoader(templates), autoescape=select_autoescape(["html"]))
    return environment.get_template("mock_sign_in.html")


__all__ = ["PendingSignIn", "SignInPages", "page"]
