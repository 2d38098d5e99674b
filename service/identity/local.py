"""The `local` identity verifier: one user on one machine. For development only.

It trusts that whoever reaches the loopback-bound connect page is the single configured local user, which holds
only when nothing but that user can reach the port. It refuses to start on any other address.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.core.identity import Identity
from service.core.urls import is_loopback_host
from service.core.verification import VerificationAttempt, Verified

from .base import NoRoutes, VerifierContext


class LocalSettings(BaseModel):
    """`[identity.local]`: the one user this connector serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(default="local", min_length=1)
    subject: str = Field(default="local-user", min_length=1)


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
        if not is_loopback_host(ctx.settings.server.host):
            raise ctx.settings.config_error(
                ("identity", "verifier"),
                f"the 'local' verifier is for development on a loopback address only, but server.host is "
                f"'{ctx.settings.server.host}'; choose another verifier or bind to 127.0.0.1",
            )
        return LocalVerifier(Identity(settings.issuer, settings.subject))
