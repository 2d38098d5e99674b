"""Building the configured identity verifier (`identity.verifier`), refusing incomplete settings."""

from __future__ import annotations

from ..runtime import Runtime
from .base import IdentityVerifier
from .confirm import ConfirmVerifier
from .local import LocalVerifier
from .oidc import OidcVerifier
from .trusted_header import TrustedHeaderVerifier


def build_verifier(runtime: Runtime) -> IdentityVerifier:
    """The verifier `identity.verifier` names. Raises ConfigError naming the key of a missing setting."""
    settings = runtime.settings
    kind = settings.identity.verifier
    if kind == "oidc":
        return OidcVerifier.from_settings(runtime)
    if kind == "trusted_header":
        return TrustedHeaderVerifier.from_settings(settings)
    if kind == "confirm":
        return ConfirmVerifier.from_settings(runtime)
    return LocalVerifier.from_settings(settings)
