"""The `trusted_header` identity verifier: an authenticating reverse proxy (oauth2-proxy, ...) names the user.

It trusts the proxy: identity headers count only when the TCP peer is inside `server.trusted_proxies`, and the
proxy must overwrite (never pass through) those headers from the browser. Identity headers arriving from any
other peer are refused with an audit event, never silently ignored: they are someone trying to be someone else.
"""

from __future__ import annotations

from ..config import Settings
from ..errors import ConfigError
from . import Identity
from .base import IdentityVerifier, VerificationAttempt, VerificationRefused, Verified

MAX_SUBJECT_LENGTH = 512


class TrustedHeaderVerifier(IdentityVerifier):
    name = "trusted_header"

    def __init__(self, issuer: str, user_headers: list[str], email_header: str | None, subject_from: str) -> None:
        self.issuer = issuer
        self.user_headers = [name.lower() for name in user_headers]
        self.email_header = email_header.lower() if email_header else None
        self.subject_from = subject_from
        # Every header that speaks about identity: all are refused from an untrusted peer.
        self.identity_headers = [*self.user_headers, *([self.email_header] if self.email_header else [])]

    @classmethod
    def from_settings(cls, settings: Settings) -> TrustedHeaderVerifier:
        where = str(settings.config_file or "environment")
        section = settings.identity.trusted_header
        if not section.issuer:
            raise ConfigError(
                where,
                "identity.trusted_header.issuer",
                "the trusted_header verifier needs the issuer its users belong to (e.g. https://login.example.com, "
                "as the agent reports it in Identity.issuer)",
            )
        if not settings.server.trusted_proxies:
            raise ConfigError(
                where,
                "server.trusted_proxies",
                "the trusted_header verifier believes identity headers only from trusted proxies: list the "
                "network(s) of the authenticating proxy (e.g. 10.0.0.5/32)",
            )
        if section.subject == "email" and not section.email_header:
            raise ConfigError(
                where,
                "identity.trusted_header.email_header",
                'subject = "email" needs the header that carries the email (e.g. X-Auth-Request-Email)',
            )
        if section.subject == "user" and not section.user_headers:
            raise ConfigError(where, "identity.trusted_header.user_headers", "name at least one user header")
        return cls(section.issuer, section.user_headers, section.email_header, section.subject)

    async def begin(self, attempt: VerificationAttempt) -> Verified:
        facts = attempt.browser
        elicitation_id = attempt.elicitation.id
        present = [name for name in self.identity_headers if facts.headers.get(name)]
        if not facts.peer_trusted:
            if present:
                raise VerificationRefused(
                    403,
                    "untrusted_identity_header",
                    "Request refused",
                    "This request names a user in its headers but did not come through the sign-in proxy, "
                    "so it is refused.",
                    event="untrusted_identity_header",
                    elicitation_id=elicitation_id,
                    detail={"peer": facts.peer, "headers": present},
                )
            raise self._not_signed_in(elicitation_id, "request did not come through a trusted proxy", facts.peer)
        names = self.user_headers if self.subject_from == "user" else [self.email_header or ""]
        values = {value.strip() for name in names for value in facts.headers.get(name, ()) if value.strip()}
        if not values:
            raise self._not_signed_in(elicitation_id, "the proxy sent no identity header", facts.peer)
        if len(values) > 1:
            raise VerificationRefused(
                403,
                "ambiguous_identity",
                "Request refused",
                "The sign-in proxy named more than one user for this request, so it is refused.",
                event="identity_header_ambiguous",
                elicitation_id=elicitation_id,
                detail={"peer": facts.peer, "headers": present},
            )
        subject = values.pop()
        if len(subject) > MAX_SUBJECT_LENGTH or not subject.isprintable():
            raise VerificationRefused(
                400,
                "bad_identity_header",
                "Request refused",
                "The sign-in proxy sent an identity this connector cannot read.",
                event="identity_header_invalid",
                elicitation_id=elicitation_id,
                detail={"peer": facts.peer},
            )
        if self.subject_from == "email":
            subject = subject.lower()
        return Verified(Identity(self.issuer, subject))

    @staticmethod
    def _not_signed_in(elicitation_id: str, reason: str, peer: str | None) -> VerificationRefused:
        return VerificationRefused(
            403,
            "not_signed_in",
            "Not signed in",
            "This connector learns who you are from its sign-in proxy, and this request did not say. "
            "Open the link through the proxy's address and sign in.",
            event="identity_missing",
            elicitation_id=elicitation_id,
            detail={"reason": reason, "peer": peer},
        )
