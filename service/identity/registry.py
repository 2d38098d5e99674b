"""Verifier plugins by name: the built-ins, those installed under the `acp_connector.verifiers` entry point group,
and any registered at run time (`register`). The rest of the connector names no concrete verifier."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from .base import VerifierPlugin
from .confirm import ConfirmPlugin
from .local import LocalPlugin
from .oidc import OidcPlugin
from .trusted_header import TrustedHeaderPlugin

log = logging.getLogger("service.identity")

ENTRY_POINT_GROUP = "acp_connector.verifiers"

_BUILT_IN: tuple[VerifierPlugin, ...] = (LocalPlugin(), OidcPlugin(), TrustedHeaderPlugin(), ConfirmPlugin())
_registered: dict[str, VerifierPlugin] = {}


def register(plugin: VerifierPlugin) -> None:
    """Make `plugin` available as `identity.verifier = "<plugin.name>"` (a later registration wins)."""
    _registered[plugin.name] = plugin


def unregister(name: str) -> None:
    _registered.pop(name, None)


def _installed() -> dict[str, VerifierPlugin]:
    found: dict[str, VerifierPlugin] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
            plugin = loaded() if isinstance(loaded, type) else loaded
        except Exception as exc:  # a broken third-party plugin must not stop the others
            log.warning("verifier plugin %s could not be loaded: %s", entry.name, type(exc).__name__)
            continue
        found[plugin.name] = plugin
    return found


def plugins() -> dict[str, VerifierPlugin]:
    """Every known verifier plugin by name."""
    return {**{p.name: p for p in _BUILT_IN}, **_installed(), **_registered}


def get(name: str) -> VerifierPlugin | None:
    return plugins().get(name)
