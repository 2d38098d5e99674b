"""The mock providers' legacy grants, as Shopify's non-expiring offline tokens, and their migration.

`MockOAuthProvider.issue_legacy_token()` hands out a token that never expires and comes with no refresh token. A
token exchange (the RFC 8693 grant type, the token as `subject_token` of `subject_token_type`, `requested_token_type`
and `params` as Shopify's migration sends them, in JSON or a form) migrates it to an expiring token and a refresh
token. The old token is dead from then on; a retry with the same token within `retry_seconds` (Shopify: seven
days) answers the same pair, until that pair is refreshed; an unknown, revoked or already-dead subject token is
`invalid_grant`. With `refuse_api_calls` the API refuses legacy tokens (Shopify's from 2027-01-01) while their
exchange still works; with `on_code_exchange` the code exchange answers a legacy token, as the provider did before
its expiring tokens (the grant a connector stores then is a legacy one, migrated at its first use).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .mock_grants import _Grant
from .mock_http import MockResponse

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 - a grant type's name
OFFLINE_ACCESS_TOKEN = "urn:shopify:params:oauth:token-type:offline-access-token"  # noqa: S105 - a token type


@dataclass
class _Migration:
    """A legacy token's exchange: the pair it was answered with (a retry gets the same one), and when."""

    answer: dict[str, Any]
    at: float


@dataclass
class LegacyTokens:
    """What a mock provider knows of legacy tokens: how their exchange is asked, which it issued, what each became."""

    subject_token_type: str = OFFLINE_ACCESS_TOKEN
    requested_token_type: str | None = OFFLINE_ACCESS_TOKEN
    params: dict[str, str] = field(default_factory=lambda: {"expiring": "1"})
    retry_seconds: float = 7 * 86400.0
    clock: Callable[[], float] = time.time
    refuse_api_calls: bool = False
    on_code_exchange: bool = False  # the code exchange answers a legacy token (`mock-provider --legacy`)
    exchanges: dict[str, int] = field(default_factory=dict)  # legacy token -> exchanges asked with it
    issued: set[str] = field(default_factory=set)  # legacy tokens handed out (live or not)
    migrated: dict[str, _Migration] = field(default_factory=dict)  # legacy token -> its exchange

    def catalog_table(self) -> dict[str, Any]:
        """The `legacy_token_exchange` table of a catalog entry that migrates these tokens."""
        table: dict[str, Any] = {"subject_token_type": self.subject_token_type, "params": dict(self.params)}
        if self.requested_token_type is not None:
            table["requested_token_type"] = self.requested_token_type
        return table

    def refusal(self, form: Mapping[str, str]) -> str | None:
        """Why an exchange's parameters are refused (counted by its subject token), or None."""
        subject = form.get("subject_token", "")
        self.exchanges[subject] = self.exchanges.get(subject, 0) + 1
        wanted = {"subject_token_type": self.subject_token_type, **self.params}
        if self.requested_token_type is not None:
            wanted["requested_token_type"] = self.requested_token_type
        return next((f"{key} is wrong" for key, value in wanted.items() if form.get(key) != value), None)

    def replayed(self, subject: str, live_refresh_tokens: set[str]) -> dict[str, Any] | None:
        """The pair a retry with `subject` gets again: within the window, and while that pair was not refreshed."""
        done = self.migrated.get(subject)
        if done is None or self.clock() - done.at > self.retry_seconds:
            return None
        return done.answer if done.answer["refresh_token"] in live_refresh_tokens else None

    def remember(self, subject: str, answer: dict[str, Any]) -> None:
        self.migrated[subject] = _Migration(answer, self.clock())


class MockLegacy:
    """Legacy grants on a mock provider (mixed into `MockOAuthProvider`, whose token state it works on)."""

    legacy: LegacyTokens
    expires_in: int | None
    issued_access_tokens: list[str]
    _access: set[str]
    _refresh: set[str]
    _grants: dict[str, _Grant]

    def _issue(
        self, grant: _Grant, *, with_scope: bool, refresh: bool = True, expires_in: int | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def issue_legacy_token(self, account: dict[str, Any] | None = None, scope: str = "read:user") -> str:
        """A legacy grant's token (as issued before expiring tokens): it never expires, no refresh token comes
        with it, and a token exchange migrates it (`mock_legacy`)."""
        token = "mock_legacy_" + secrets.token_urlsafe(24)
        grant = _Grant(scope, None, refreshable=False, account=account)
        self.issued_access_tokens.append(token)
        self._access.add(token)
        self.legacy.issued.add(token)
        self._grants[token] = grant
        grant.tokens.add(token)
        return token

    def _exchange(self, form: Mapping[str, str]) -> MockResponse:
        """A legacy token's migration (RFC 8693 token exchange, as Shopify's): see `mock_legacy`."""
        subject, legacy = form.get("subject_token", ""), self.legacy
        refusal = legacy.refusal(form)
        if refusal is not None:
            return MockResponse.json(400, {"error": "invalid_request", "error_description": refusal})
        again = legacy.replayed(subject, self._refresh)
        if again is not None:
            self._access.add(again["access_token"])  # the same pair, its access token's expiry extended
            return MockResponse.json(200, again)
        if subject not in legacy.issued or subject not in self._access:
            return MockResponse.json(400, {"error": "invalid_grant", "error_description": "bad subject token"})
        grant = self._grants[subject]
        self._access.discard(subject)  # the legacy token dies with its exchange
        grant.refreshable = True
        answer = self._issue(grant, with_scope=True, expires_in=self.expires_in or 3600)
        answer["refresh_token_expires_in"] = 90 * 86400
        legacy.remember(subject, answer)
        return MockResponse.json(200, answer)

    def api_accepts(self, token: str) -> bool:
        """Whether an API call carrying `token` is answered (a live access token, and not a refused legacy one)."""
        return token in self._access and not (self.legacy.refuse_api_calls and token in self.legacy.issued)
