"""The page after the provider's redirect, at a clean address.

The provider's redirect carries `code` and `state` in its query string. The callback answers it with a redirect
(303), so neither stays in the address bar or the history: to `/connect/<id>/done` when the authorization went
through, to `/callback/<provider>/failed/<ticket>` when the callback was refused. What that page says travels in a
cookie that lives for a few minutes, only on that path, encrypted by the vault and bound to the browser's binding
(and, for the done page, to the elicitation; for the failed page, to its ticket): another browser, or another
elicitation's page, reads nothing. Each refusal has a ticket of its own, so refusals that cross (a double click)
each keep their page. The page is told once: it takes the cookie.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import VaultError
from ..vault import Vault

RESULT_MAX_AGE = 300
TEXT_LIMIT = 1000  # a refusal's sentence may quote the provider's error description: keep the cookie small


def done_path(elicitation_id: str) -> str:
    return f"/connect/{elicitation_id}/done"


FAILURE_TICKET = re.compile(r"[A-Za-z0-9_-]{16}")


def new_failure_ticket() -> str:
    return secrets.token_urlsafe(12)  # 16 characters of FAILURE_TICKET


def failed_path(provider: str, ticket: str) -> str:
    return f"/callback/{provider}/failed/{ticket}"


@dataclass(frozen=True, slots=True)
class Result:
    """What the done page tells: the provider, the account (None when the provider named none), and whether the
    agent had cancelled its request before the user finished."""

    display_name: str
    account_label: str | None
    agent_cancelled: bool


@dataclass(frozen=True, slots=True)
class Failure:
    """What the failed page tells: the refusal's page as the callback would have answered it, and the callback's
    request id (the one its log lines carry)."""

    status: int
    title: str
    text: str
    code: str
    outcome: bool
    request_id: str | None


class SealedCookie:
    """A small JSON value in an HttpOnly cookie on one path, encrypted by the vault under associated data."""

    def __init__(self, vault: Vault, *, name: str, secure: bool, max_age: int = RESULT_MAX_AGE) -> None:
        self.vault = vault
        self.secure = secure
        self.name = f"__Secure-{name}" if secure else name
        self.max_age = max_age

    def set(self, response: Response, path: str, aad: bytes, value: dict[str, Any]) -> None:
        key_id, blob = self.vault.encrypt_json(value, aad=aad)
        sealed = f"{key_id}.{base64.urlsafe_b64encode(blob).decode().rstrip('=')}"
        # lax: the provider's redirect back, and our 303s after it, are top-level navigations
        response.set_cookie(
            self.name, sealed, max_age=self.max_age, path=path, secure=self.secure, httponly=True, samesite="lax"
        )

    def read(self, request: Request, aad: bytes) -> dict[str, Any] | None:
        key_id, _, encoded = request.cookies.get(self.name, "").partition(".")
        if not key_id or not encoded:
            return None
        try:
            blob = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            body = self.vault.decrypt_json(key_id, blob, aad=aad)
        except (binascii.Error, ValueError, VaultError):
            return None
        return body if isinstance(body, dict) else None

    def clear(self, response: Response, path: str) -> None:
        response.delete_cookie(self.name, path=path, secure=self.secure, httponly=True)


class ResultCookie:
    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.cookie = SealedCookie(vault, name="connector-result", secure=secure)

    def set(self, response: Response, elicitation_id: str, binding: str, result: Result) -> None:
        value = {"provider": result.display_name, "account": result.account_label, "cancelled": result.agent_cancelled}
        self.cookie.set(response, done_path(elicitation_id), _result_aad(elicitation_id, binding), value)

    def read(self, request: Request, elicitation_id: str, binding: str | None) -> Result | None:
        """The result this browser was sent here with, or None (none, another browser's, another page's)."""
        body = None if binding is None else self.cookie.read(request, _result_aad(elicitation_id, binding))
        if body is None or not isinstance(body.get("provider"), str):
            return None
        account = body.get("account")
        return Result(body["provider"], account if isinstance(account, str) else None, body.get("cancelled") is True)

    def clear(self, response: Response, elicitation_id: str) -> None:
        """Told once: a reload says nothing more."""
        self.cookie.clear(response, done_path(elicitation_id))


class FailureCookie:
    """The refused callback's page, for `/callback/<provider>/failed/<ticket>`. Bound to the ticket, and to the
    browser's binding when it has one (a callback is refused too when the browser has none: that page is then
    readable by this browser alone anyway, since the cookie was only ever sent to it)."""

    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.cookie = SealedCookie(vault, name="connector-failure", secure=secure)

    def set(self, response: Response, provider: str, ticket: str, binding: str | None, failure: Failure) -> None:
        value = {
            "status": failure.status,
            "title": failure.title,
            "text": failure.text[:TEXT_LIMIT],
            "code": failure.code,
            "outcome": failure.outcome,
            "request_id": failure.request_id,
        }
        self.cookie.set(response, failed_path(provider, ticket), _failure_aad(provider, ticket, binding), value)

    def read(self, request: Request, provider: str, ticket: str, binding: str | None) -> Failure | None:
        body = self.cookie.read(request, _failure_aad(provider, ticket, binding))
        if body is None:
            return None
        status, title, text, code = body.get("status"), body.get("title"), body.get("text"), body.get("code")
        if not (isinstance(status, int) and isinstance(title, str) and isinstance(text, str) and isinstance(code, str)):
            return None
        request_id = body.get("request_id")
        return Failure(
            status, title, text, code, body.get("outcome") is True, request_id if isinstance(request_id, str) else None
        )

    def clear(self, response: Response, provider: str, ticket: str) -> None:
        self.cookie.clear(response, failed_path(provider, ticket))


def _result_aad(elicitation_id: str, binding: str) -> bytes:
    return f"result\x00{elicitation_id}\x00{binding}".encode()


def _failure_aad(provider: str, ticket: str, binding: str | None) -> bytes:
    return f"failure\x00{provider}\x00{ticket}\x00{binding or ''}".encode()
