"""Identity verifiers: how the connector learns who is in the browser. One module per verifier, found by name
in `registry`; each owns its settings (`[identity.<name>]`), its routes and the rows it keeps (see `base`)."""

from .base import IdentityVerifier, RouteKit, VerifierContext, VerifierPlugin, VerifierRoute, VerifierRoutes
from .registry import get, plugins, register, unregister

__all__ = [
    "IdentityVerifier",
    "RouteKit",
    "VerifierContext",
    "VerifierPlugin",
    "VerifierRoute",
    "VerifierRoutes",
    "get",
    "plugins",
    "register",
    "unregister",
]
