"""The page after the provider's redirect, at a clean address.

The provider's redirect carries `code` and `state` in its query string. The callback answers it with a redirect to
`/connect/<id>/done`, so neither stays in the address bar or the history; what that page says (connected, and to
which account) travels in a cookie that lives for a few minutes, only on that path, encrypted by the vault and bound
to the elicitation and to the browser's binding: another browser, or another elicitation's page, reads nothing.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import VaultError
from ..vault import Vault

RESULT_COOKIE_SECURE = "__Secure-connector-result"
RESULT_COOKIE_DEV = "connector-result"
RESULT_MAX_AGE = 300


def done_path(elicitation_id: str) -> str:
    return f"/connect/{elicitation_id}/done"


@dataclass(frozen=True, slots=True)
class Result:
    """What the done page tells: the provider, the account (None when the provider named none), and whether the
    agent had cancelled its request before the user finished."""

    display_name: str
    account_label: str | None
    agent_cancelled: bool


class ResultCookie:
    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.vault = vault
        self.secure = secure
        self.name = RESULT_COOKIE_SECURE if secure else RESULT_COOKIE_DEV

    def set(self, response: Response, elicitation_id: str, binding: str, result: Result) -> None:
        key_id, blob = self.vault.encrypt_json(
            {"provider": result.display_name, "account": result.account_label, "cancelled": result.agent_cancelled},
            aad=_aad(elicitation_id, binding),
        )
        value = f"{key_id}.{base64.urlsafe_b64encode(blob).decode().rstrip('=')}"
        response.set_cookie(
            self.name,
            value,
            max_age=RESULT_MAX_AGE,
            path=done_path(elicitation_id),
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )

    def read(self, request: Request, elicitation_id: str, binding: str | None) -> Result | None:
        """The result this browser was sent here with, or None (none, another browser's, another page's)."""
        key_id, _, encoded = request.cookies.get(self.name, "").partition(".")
        if binding is None or not key_id or not encoded:
            return None
        try:
            blob = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            body = self.vault.decrypt_json(key_id, blob, aad=_aad(elicitation_id, binding))
        except (binascii.Error, ValueError, VaultError):
            return None
        if not isinstance(body, dict) or not isinstance(body.get("provider"), str):
            return None
        account = body.get("account")
        return Result(body["provider"], account if isinstance(account, str) else None, body.get("cancelled") is True)

    def clear(self, response: Response, elicitation_id: str) -> None:
        """Told once: a reload says nothing more."""
        response.delete_cookie(self.name, path=done_path(elicitation_id), secure=self.secure, httponly=True)


def _aad(elicitation_id: str, binding: str) -> bytes:
    return f"result\x00{elicitation_id}\x00{binding}".encode()
