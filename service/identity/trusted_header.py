"""The `trusted_header` identity verifier: an authenticating reverse proxy (oauth2-proxy, ...) names the user.

It trusts the proxy: identity headers count only when the TCP peer is inside `server.trusted_proxies`, and the
proxy must overwrite (never pass through) those headers from the browser. Identity headers arriving from any
other peer are refused with an audit event, never silently ignored: they are someone trying to be someone else.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from service.core.errors import FlowRefused
from service.core.identity import Identity
from service.core.verification import VerificationAttempt, Verified

from .base import NoRoutes, OptionalText, TextList, VerifierContext, VerifierSettings

MAX_SUBJECT_LENGTH = 512


class TrustedHeaderSettings(VerifierSettings):
    """`[identity.trusted_header]`: an authenticating reverse proxy (oauth2-proxy, ...) names the user."""

    issuer: OptionalText = None
    """The issuer the proxy's user names belong to (what the agent reports as Identity.issuer). Required."""
    user_headers: TextList = Field(default_factory=lambda: ["X-Forwarded-User", "X-Auth-Request-User"])
    """Headers that carry the user name, in the order they are read; two naming different users are refused, and any
    of them from outside server.trusted_proxies is refused with 403."""
    email_header: OptionalText = None
    """The header with the user's email (e.g. X-Auth-Request-Email); needed when subject is email."""
    subject: Literal["user", "email"] = "user"
    """Which header gives Identity.subject: user (user_headers) or email (email_header, lower-cased)."""

    @field_validator("user_headers")
    @classmethod
    def _check_headers(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9-]+", name):
                raise ValueError(f"'{name}' is not an HTTP header name")
        return value


class TrustedHeaderVerifier(NoRoutes):
    name = "trusted_header"

    def __init__(self, issuer: str, user_headers: list[str], email_header: str | None, subject_from: str) -> None:
        self.issuer = issuer
        self.user_headers = [name.lower() for name in user_headers]
        self.email_header = email_header.lower() if email_header else None
        self.subject_from = subject_from
        # Every header that speaks about identity: all are refused from an untrusted peer.
        self.identity_headers = [*self.user_headers, *([self.email_header] if self.email_header else [])]

    async def begin(self, attempt: VerificationAttempt) -> Verified:
        facts = attempt.browser
        elicitation_id = attempt.elicitation.id
        present = [name for name in self.identity_headers if facts.headers.get(name)]
        if not facts.peer_trusted:
            if present:
                raise FlowRefused(
                    "untrusted_identity_header",
                    event="untrusted_identity_header",
                    elicitation_id=elicitation_id,
                    audit={"peer": facts.peer, "headers": present},
                )
            raise self._not_signed_in(elicitation_id, "request did not come through a trusted proxy", facts.peer)
        names = self.user_headers if self.subject_from == "user" else [self.email_header or ""]
        values = {value.strip() for name in names for value in facts.headers.get(name, ()) if value.strip()}
        if not values:
            raise self._not_signed_in(elicitation_id, "the proxy sent no identity header", facts.peer)
        if len(values) > 1:
            raise FlowRefused(
                "ambiguous_identity",
                event="identity_header_ambiguous",
                elicitation_id=elicitation_id,
                audit={"peer": facts.peer, "headers": present},
            )
        subject = values.pop()
        if len(subject) > MAX_SUBJECT_LENGTH or not subject.isprintable():
            raise FlowRefused(
                "bad_identity_header",
                event="identity_header_invalid",
                elicitation_id=elicitation_id,
                audit={"peer": facts.peer},
            )
        if self.subject_from == "email":
            subject = subject.lower()
        return Verified(Identity(self.issuer, subject))

    @staticmethod
    def _not_signed_in(elicitation_id: str, reason: str, peer: str | None) -> FlowRefused:
        return FlowRefused(
            "not_signed_in",
            event="identity_missing",
            elicitation_id=elicitation_id,
            audit={"reason": reason, "peer": peer},
        )


class TrustedHeaderPlugin:
    name = "trusted_header"
    settings_model = TrustedHeaderSettings

    def build(self, ctx: VerifierContext, settings: TrustedHeaderSettings) -> TrustedHeaderVerifier:
        config = ctx.settings
        if not settings.issuer:
            raise config.config_error(
                ("identity", "trusted_header", "issuer"),
                "the trusted_header verifier needs the issuer its users belong to (e.g. https://login.example.com, "
                "as the agent reports it in Identity.issuer)",
            )
        if not config.server.trusted_proxies:
            raise config.config_error(
                ("server", "trusted_proxies"),
                "the trusted_header verifier believes identity headers only from trusted proxies: list the "
                "network(s) of the authenticating proxy (e.g. 10.0.0.5/32)",
            )
        if settings.subject == "email" and not settings.email_header:
            raise config.config_error(
                ("identity", "trusted_header", "email_header"),
                'subject = "email" needs the header that carries the email (e.g. X-Auth-Request-Email)',
            )
        if settings.subject == "user" and not settings.user_headers:
            raise config.config_error(("identity", "trusted_header", "user_headers"), "name at least one user header")
        return TrustedHeaderVerifier(settings.issuer, settings.user_headers, settings.email_header, settings.subject)
