"""The mock providers' requests and answers, whatever the transport: plain values the endpoint logic works on."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode


@dataclass(frozen=True, slots=True)
class MockRequest:
    """What an endpoint sees, whatever the transport: the path is relative to the provider's base URL."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""

    def form(self) -> dict[str, str]:
        return first_values(self.body.decode("utf-8", errors="replace"))

    def params(self) -> dict[str, str]:
        """The body's parameters: a JSON object's members (Content-Type application/json), else the form's."""
        if not self.header("content-type").startswith("application/json"):
            return self.form()
        try:
            body = json.loads(self.body or b"{}")
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in body.items()} if isinstance(body, dict) else {}

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True, slots=True)
class MockResponse:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def json(cls, status: int, body: Any) -> MockResponse:
        return cls(status, {"content-type": "application/json"}, json.dumps(body).encode())

    @classmethod
    def text(cls, status: int, text: str) -> MockResponse:
        return cls(status, {"content-type": "text/plain; charset=utf-8"}, text.encode())

    @classmethod
    def redirect(cls, redirect_uri: str, **params: str | None) -> MockResponse:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        sep = "&" if "?" in redirect_uri else "?"
        return cls(302, {"location": f"{redirect_uri}{sep}{query}"})


def first_values(query: str) -> dict[str, str]:
    """A query string or form body as {name: first value}."""
    return {k: v[0] for k, v in parse_qs(query).items()}


def s256(verifier: str) -> str:
    """The PKCE S256 challenge of `verifier` (RFC 7636 4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


__all__ = ["MockRequest", "MockResponse", "first_values", "s256"]
