"""`MockKeyedApi`: a provider API protected by an API key (or an HTTP Basic pair), with a check endpoint.

It accepts the keys in `keys` (each with the account it belongs to) in the form its `injection` names: a header
and template (`Authorization: Bearer {api_key}`, `X-Api-Key: {api_key}`), HTTP Basic, or a query parameter, the
way the credential entries of the catalog carry them. `/v1/me` is the check endpoint (the account, or 401 with
`{"error": {"code": "invalid_api_key"}}`), `/v1/items` a protected resource. `revoke(key)` makes the provider stop
accepting a key; `check_timeouts` leaves the next check calls unanswered. For tests and `serve --demo`.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .mock_http import MockRequest, MockResponse
from .mock_serving import MockServing

CHECK_PATH = "/v1/me"
ITEMS_PATH = "/v1/items"


def new_key(prefix: str = "mk_live_") -> str:
    """A random key of the mock's shape (`mk_live_` and 32 URL-safe characters)."""
    return prefix + secrets.token_hex(16)


@dataclass
class MockKeyedApi(MockServing):
    """An API key-protected API at `base_url` (see the module's doc)."""

    base_url: str = "https://keyed.mock-provider.test"
    display_name: str = "Keyed Mock API"
    # How the key travels: "header" (with `header` and `template`), "basic" (the key as password of user
    # `basic_user`; or, with `basic_user` None, two fields: `{account}:{key}`) or "query" (`parameter`).
    style: str = "header"
    header: str = "Authorization"
    template: str = "Bearer {key}"
    parameter: str = "api_key"
    basic_user: str | None = "api"
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # accepted key -> its account
    items: list[dict[str, Any]] = field(default_factory=lambda: [{"id": 1, "name": "first item"}])
    check_timeouts: int = 0  # check calls (from now) that get no answer at all
    refresh_delay: float = 0.0  # (MockServing's knobs: unused here)
    response_delay: float = 0.0
    api_calls: list[str] = field(default_factory=list)  # paths of every call, accepted or not
    presented: list[str] = field(default_factory=list)  # what each call carried where the key goes (for tests)

    def add_key(self, account: dict[str, Any] | None = None, key: str | None = None) -> str:
        """Accept a new key (random unless given) for `account`; returns it."""
        key = key or new_key()
        self.keys[key] = account or {"id": f"acct_{secrets.token_hex(4)}", "name": "Mock Account"}
        return key

    def revoke(self, key: str) -> None:
        """The provider stops accepting `key` (as when the user revokes it in the provider's console)."""
        self.keys.pop(key, None)

    def secrets_issued(self) -> list[str]:
        return list(self.keys)

    def catalog_entry(self, field_name: str = "api_key") -> dict[str, Any]:
        """A credential table for a providers.toml: the field, how it is injected, the check request."""
        placeholder = "{" + field_name + "}"
        injection: dict[str, Any]
        if self.style == "basic":
            injection = {"style": "basic", "username": self.basic_user or "{account}", "password": placeholder}
        elif self.style == "query":
            injection = {"style": "query", "parameter": self.parameter, "template": placeholder}
        else:
            injection = {"header": self.header, "template": self.template.replace("{key}", placeholder)}
        fields: dict[str, Any] = {
            field_name: {
                "label": "API key",
                "help": f"A key of the {self.display_name}; it starts with mk_live_.",
                "docs_url": "https://keyed.mock-provider.test/docs/keys",
                "prefix": "mk_live_",
                "min_length": 40,
                "max_length": 40,
                "characters": "a-z0-9_",
            }
        }
        if self.style == "basic" and self.basic_user is None:
            fields = {
                "account": {
                    "label": "Account id",
                    "help": "Your account id.",
                    "docs_url": "https://keyed.mock-provider.test/docs/account",
                    "secret": False,
                },
                **fields,
            }
        return {
            "kind": "basic" if self.style == "basic" else "api_key",
            "display_name": self.display_name,
            "docs_url": "https://keyed.mock-provider.test/docs",
            "api_base_url": self.base_url,
            "revoke_url": "https://keyed.mock-provider.test/settings/keys",
            "fields": fields,
            "inject": [injection],
            "check": {"path": CHECK_PATH, "account": "/id", "error": "/error/code", "timeout_seconds": 2.0},
        }

    # -- serving ---------------------------------------------------------------------------------------
    def _routes(self) -> dict[tuple[str, str], Callable[[MockRequest], MockResponse]]:
        return {("GET", CHECK_PATH): self._me, ("GET", ITEMS_PATH): self._items}

    def handle(self, request: MockRequest) -> MockResponse:
        endpoint = self._routes().get((request.method.upper(), request.path))
        if endpoint is None:
            return MockResponse.json(404, {"error": {"code": "not_found"}})
        return endpoint(request)

    def _answer_lost(self, request: MockRequest, answer: MockResponse) -> bool:
        return False

    def _timed_out(self, request: MockRequest) -> bool:
        if self.check_timeouts <= 0 or request.path != CHECK_PATH:
            return False
        self.check_timeouts -= 1
        return True

    def _presented(self, request: MockRequest) -> str:
        if self.style == "query":
            return request.query.get(self.parameter, "")
        if self.style == "basic":
            return request.header("authorization")
        return request.header(self.header)

    def _account(self, request: MockRequest) -> dict[str, Any] | None:
        """The account of the key the request carries in this API's form, or None."""
        presented = self._presented(request)
        self.presented.append(presented)
        if self.style == "basic":
            scheme, _, encoded = presented.partition(" ")
            try:
                user, _, key = base64.b64decode(encoded).decode().partition(":")
            except ValueError:
                return None
            account = self.keys.get(key) if scheme.lower() == "basic" else None
            expected_user = self.basic_user if self.basic_user is not None else str((account or {}).get("id"))
            return account if user == expected_user else None
        if self.style == "query":
            return self.keys.get(presented)
        prefix, _, suffix = self.template.partition("{key}")
        if not presented.startswith(prefix) or not presented.endswith(suffix):
            return None
        return self.keys.get(presented[len(prefix) : len(presented) - len(suffix) or None])

    def _me(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(request.path)
        account = self._account(request)
        if account is None:
            return MockResponse.json(401, {"error": {"code": "invalid_api_key", "message": "Incorrect API key"}})
        return MockResponse.json(200, account)

    def _items(self, request: MockRequest) -> MockResponse:
        self.api_calls.append(request.path)
        if self._account(request) is None:
            return MockResponse.json(401, {"error": {"code": "invalid_api_key"}})
        return MockResponse.json(200, {"items": self.items})


__all__ = ["MockKeyedApi", "new_key"]
