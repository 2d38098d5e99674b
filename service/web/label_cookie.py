"""The account label the user typed on the consent page, carried to the provider's callback in this browser only.

The label is typed before the identity step (which may send the browser to a sign-in elsewhere first) and stored
with the grant when the provider sends the browser back. It travels in a short-lived cookie, only on the providers'
callback paths (`/callback/`), encrypted by the vault and bound to the elicitation and to the browser's binding:
another browser, or another elicitation, reads nothing, so whoever else holds the link cannot name the account.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..vault import Vault
from .result import SealedCookie

LABEL_COOKIE = "connector-label-"
LABEL_MAX_AGE = 900  # the elicitation's flow lasts at most 10 minutes at the provider (core.browser.FLOW_TTL)
LABEL_PATH = "/callback/"


def _aad(elicitation_id: str, binding: str) -> bytes:
    return f"account-label|{elicitation_id}|{binding}".encode()


class LabelCookie:
    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.vault = vault
        self.secure = secure

    def _cookie(self, elicitation_id: str) -> SealedCookie:
        # One per elicitation: two consent pages open in one browser.
        name = LABEL_COOKIE + elicitation_id[:16]
        return SealedCookie(self.vault, name=name, secure=self.secure, max_age=LABEL_MAX_AGE)

    def set(self, response: Response, elicitation_id: str, binding: str, label: str | None) -> None:
        """Keep `label` for the provider's callback (None: forget a label given before)."""
        if label is None:
            self.clear(response, elicitation_id)
            return
        self._cookie(elicitation_id).set(response, LABEL_PATH, _aad(elicitation_id, binding), {"label": label})

    def read(self, request: Request, elicitation_id: str, binding: str | None) -> str | None:
        """The label this browser gave for this elicitation, or None (none, another browser's, another one's)."""
        body = None if binding is None else self._cookie(elicitation_id).read(request, _aad(elicitation_id, binding))
        label = body.get("label") if body is not None else None
        return label if isinstance(label, str) else None

    def clear(self, response: Response, elicitation_id: str) -> None:
        self._cookie(elicitation_id).clear(response, LABEL_PATH)
