"""The `local` identity verifier: one user on one machine. For development only.

It trusts that whoever reaches the loopback-bound connect page is the single configured local user, which holds
only when nothing but that user can reach the page. So it refuses to start when anyone else could: a non-loopback
`server.host` or `public_base_url`, or any `server.trusted_proxies` (a proxy forwards other people's browsers).
`[identity.local] unsafe_allow_remote = true` overrides that, with a warning logged at every start.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field

from service.core.identity import Identity
from service.core.urls import is_loopback_host
from service.core.verification import VerificationAttempt, Verified

from .base import NoRoutes, VerifierContext

log = logging.getLogger("service.identity.local")


class LocalSettings(BaseModel):
    """`[identity.local]`: the one user this connector serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(default="local", min_length=1)
    """The issuer of the one user this connector serves (what the agent reports as Identity.issuer)."""
    subject: str = Field(default="local-user", min_length=1)
    """That user's subject (Identity.subject)."""
    unsafe_allow_remote: bool = False
    """Start even where others can reach the connect page (every one of them is then this user); logged as UNSAFE at
    every start."""


class LocalVerifier(NoRoutes):
    name = "local"

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    def user(self) -> Identity:
        """The identity the agent should bind its elicitations to in a local deployment."""
        return self.identity

    async def begin(self, attempt: VerificationAttempt) -> Verified:
        return Verified(self.identity)


class LocalPlugin:
    name = "local"
    settings_model = LocalSettings

    def build(self, ctx: VerifierContext, settings: LocalSettings) -> LocalVerifier:
        config = ctx.settings
        reachable = _reachable_by_others(config.server.host, config.public_host, config.server.trusted_proxies)
        if reachable is not None:
            key, why = reachable
            if not settings.unsafe_allow_remote:
                raise config.config_error(
                    key,
                    f"the 'local' verifier takes whoever opens the connect page for the one local user, so it runs "
                    f"only where no one else can reach it, but {why}; choose another identity.verifier, or set "
                    "identity.local.unsafe_allow_remote = true if every browser that can reach it is yours",
                )
            log.warning(
                "UNSAFE: the 'local' identity verifier runs where others can reach it (%s) because "
                "identity.local.unsafe_allow_remote is set: anyone who opens a connect link is taken for %s",
                why,
                settings.subject,
            )
        return LocalVerifier(Identity(settings.issuer, settings.subject))


def _reachable_by_others(host: str, public_host: str, trusted_proxies: list[str]) -> tuple[tuple[str, ...], str] | None:
    """The setting (and why) that lets someone other than the local user reach the connect page, if any."""
    if not is_loopback_host(host):
        return ("server", "host"), f"server.host is '{host}', not a loopback address"
    if not is_loopback_host(public_host):
        return ("public_base_url",), f"public_base_url names '{public_host}', not a loopback host"
    if trusted_proxies:
        return ("server", "trusted_proxies"), "server.trusted_proxies is set (a proxy forwards other browsers)"
    return None
