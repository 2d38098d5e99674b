"""The account label the user typed on the consent page, carried to the provider's callback in this browser only.

The label is typed before the identity step (which may send the browser to a sign-in elsewhere first) and stored
with the grant when the provider sends the browser back. It travels in a short-lived cookie, only on the providers'
callback paths (`/callback/`), encrypted by the vault and bound to the elicitation and to the browser's binding:
another browser, or another elicitation, reads nothing, so whoever else holds the link cannot name the account.
"""

from __future__ import annotations

import base64
import binascii

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import VaultError
from ..vault import Vault

LABEL_COOKIE_SECURE = "__Secure-connector-label-"
LABEL_COOKIE_DEV = "connector-label-"
LABEL_MAX_AGE = 900  # the elicitation's flow lasts at most 10 minutes at the provider (core.browser.FLOW_TTL)
LABEL_PATH = "/callback/"


def _aad(elicitation_id: str, binding: str) -> bytes:
    return f"account-label|{elicitation_id}|{binding}".encode()


class LabelCookie:
    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.vault = vault
        self.secure = secure
        self.prefix = LABEL_COOKIE_SECURE if secure else LABEL_COOKIE_DEV

    def _name(self, elicitation_id: str) -> str:
        return self.prefix + elicitation_id[:16]  # one per elicitation: two consent pages open in one browser

    def set(self, response: Response, elicitation_id: str, binding: str, label: str | None) -> None:
        """Keep `label` for the provider's callback (None: forget a label given before)."""
        if label is None:
            self.clear(response, elicitation_id)
            return
        key_id, blob = self.vault.encrypt_json({"label": label}, aad=_aad(elicitation_id, binding))
        value = f"{key_id}.{base64.urlsafe_b64encode(blob).decode().rstrip('=')}"
        response.set_cookie(
            self._name(elicitation_id),
            value,
            max_age=LABEL_MAX_AGE,
            path=LABEL_PATH,
            secure=self.secure,
            httponly=True,
            samesite="lax",  # the provider's redirect back is a top-level navigation
        )

    def read(self, request: Request, elicitation_id: str, binding: str | None) -> str | None:
        """The label this browser gave for this elicitation, or None (none, another browser's, another one's)."""
        key_id, _, encoded = request.cookies.get(self._name(elicitation_id), "").partition(".")
        if binding is None or not key_id or not encoded:
            return None
        try:
            blob = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            body = self.vault.decrypt_json(key_id, blob, aad=_aad(elicitation_id, binding))
        except (binascii.Error, ValueError, VaultError):
            return None
        label = body.get("label") if isinstance(body, dict) else None
        return label if isinstance(label, str) else None

    def clear(self, response: Response, elicitation_id: str) -> None:
        response.delete_cookie(self._name(elicitation_id), path=LABEL_PATH, secure=self.secure, httponly=True)
