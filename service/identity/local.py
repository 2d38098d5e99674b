"""The `local` identity verifier: one user on one machine. For development only.

It trusts that whoever reaches the loopback-bound connect page is the single configured local user,
which holds only when nothing but that user can reach the port. It refuses to start on any other address.
"""

from __future__ import annotations

from ..config import Settings, is_loopback_host
from ..errors import ConfigError
from . import Identity
from .base import IdentityVerifier, VerificationAttempt, Verified


class LocalVerifier(IdentityVerifier):
    name = "local"

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalVerifier:
        if not is_loopback_host(settings.server.host):
            raise ConfigError(
                str(settings.config_file or "environment"),
                "identity.verifier",
                f"the 'local' verifier is for development on a loopback address only, but server.host is "
                f"'{settings.server.host}'; choose another verifier or bind to 127.0.0.1",
            )
        return cls(Identity(settings.identity.local_issuer, settings.identity.local_subject))

    def user(self) -> Identity:
        """The identity the agent should bind its elicitations to in a local deployment."""
        return self.identity

    async def identify(self) -> Identity:
        """The user in the browser: always the single local user."""
        return self.identity

    async def begin(self, attempt: VerificationAttempt) -> Verified:
        return Verified(self.identity)
