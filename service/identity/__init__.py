"""Identity verifiers: how the connector learns who is in the browser. One module per verifier, found by name
in `registry`; each owns its settings (`[identity.<name>]`), its routes and the rows it keeps (see `base`)."""

from .base import (
    IdentityVerifier,
    OptionalText,
    OptionalUrl,
    RouteKit,
    TextList,
    VerifierContext,
    VerifierPlugin,
    VerifierRoute,
    VerifierRoutes,
    VerifierSettings,
)
from .registry import get, plugins, register, unregister

__all__ = [
    "IdentityVerifier",
    "OptionalText",
    "OptionalUrl",
    "RouteKit",
    "TextList",
    "VerifierContext",
    "VerifierPlugin",
    "VerifierRoute",
    "VerifierRoutes",
    "VerifierSettings",
    "get",
    "plugins",
    "register",
    "unregister",
]
