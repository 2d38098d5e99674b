"""The settings the domain needs, as plain values (the composition root builds them from `service.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class FlowSettings:
    public_base_url: str  # no trailing slash
    agent_name: str
    elicitation_ttl: timedelta  # from elicitation/create to the end of the browser flow
    max_mismatches: int  # identity mismatches an elicitation survives; the last one locks it
    verifier_name: str  # the configured identity verifier, for audit lines

    def connect_url(self, elicitation_id: str) -> str:
        return f"{self.public_base_url}/connect/{elicitation_id}"

    def callback_url(self, provider: str) -> str:
        """One redirect URI per provider: the mix-up fallback of RFC 9700 section 4.4."""
        return f"{self.public_base_url}/callback/{provider}"
