"""Browser-facing safety: response headers, the browser-binding cookie and CSRF tokens."""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response

from ..vault import Vault

BINDING_COOKIE_SECURE = "__Host-connector-browser"
BINDING_COOKIE_DEV = "connector-browser"
BINDING_MAX_AGE = 3600

BASE_CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def csp_with_form_target(origin: str) -> str:
    """The consent form posts to us and we redirect to the provider; browsers apply form-action to that redirect."""
    return BASE_CSP.replace("form-action 'self'", f"form-action 'self' {origin}")


Header = tuple[bytes, bytes]


def security_headers(*, https: bool) -> tuple[Header, ...]:
    """The headers every response needs, built once per app; a response may set its own (its CSP) first."""
    headers = [
        (b"content-security-policy", BASE_CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-store"),
        (b"x-frame-options", b"DENY"),
        (b"cross-origin-opener-policy", b"same-origin"),
    ]
    if https:
        headers.append((b"strict-transport-security", b"max-age=63072000; includeSubDomains"))
    return tuple(headers)


def with_security_headers(headers: Iterable[Header], defaults: tuple[Header, ...]) -> list[Header]:
    """`headers` and each of `defaults` whose name the response did not set itself."""
    out = list(headers)
    present = {name.lower() for name, _ in out}
    out.extend(header for header in defaults if header[0] not in present)
    return out


class BrowserBinding:
    """A random per-browser value (the binding) in an HttpOnly cookie, signed with a key derived from the vault:
    `<binding>.<key id>.<mac>`. A value this server did not issue is no binding at all. The flow stores only the
    binding's hash."""

    PURPOSE = "browser-binding"

    def __init__(self, vault: Vault, *, secure: bool) -> None:
        self.vault = vault
        self.secure = secure
        self.cookie_name = BINDING_COOKIE_SECURE if secure else BINDING_COOKIE_DEV

    def read(self, request: Request) -> str | None:
        """The binding of a cookie this server signed, else None."""
        binding, _, signature = request.cookies.get(self.cookie_name, "").partition(".")
        if len(binding) < 32 or not self.vault.verify(self.PURPOSE, binding.encode(), signature):
            return None
        return binding

    def ensure(self, request: Request) -> tuple[str, bool]:
        """(binding, is_new)."""
        current = self.read(request)
        if current is not None:
            return current, False
        return secrets.token_urlsafe(32), True

    def set(self, response: Response, binding: str) -> None:
        response.set_cookie(
            self.cookie_name,
            f"{binding}.{self.vault.sign(self.PURPOSE, binding.encode())}",
            max_age=BINDING_MAX_AGE,
            path="/",
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )


def csrf_token(vault: Vault, elicitation_id: str, binding: str) -> str:
    return vault.sign("csrf", f"{elicitation_id}\x00{binding}".encode())


def csrf_valid(vault: Vault, elicitation_id: str, binding: str | None, token: str | None) -> bool:
    if binding is None or not token:
        return False
    return vault.verify("csrf", f"{elicitation_id}\x00{binding}".encode(), token)
