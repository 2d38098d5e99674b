"""The parts one connector instance shares between its agent-facing API and its web routes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from .config import Settings
from .events import CompletionBus
from .oauth import JwksCache
from .providers import ProviderCatalog
from .store import Store
from .vault import Vault


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Runtime:
    settings: Settings
    store: Store
    vault: Vault
    catalog: ProviderCatalog
    bus: CompletionBus = field(default_factory=CompletionBus)
    clock: Callable[[], datetime] = utcnow
    # For provider discovery documents; token traffic uses per-call clients in oauth.py.
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=15.0))
    # Providers' ID-token signing keys, read with `http` and cached.
    jwks: JwksCache = field(default_factory=JwksCache)

    def now(self) -> datetime:
        return self.clock()

    def callback_url(self, provider: str) -> str:
        """One redirect URI per provider: the mix-up fallback of RFC 9700 section 4.4."""
        return f"{self.settings.public_base_url}/callback/{provider}"

    def connect_url(self, elicitation_id: str) -> str:
        return f"{self.settings.public_base_url}/connect/{elicitation_id}"
