"""The settings the domain needs, as plain values (the composition root builds them from `service.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

# How long a rotated-out webhook secret keeps signing alongside the new one, unless the rotation says otherwise
# (here, not in core.webhooks, so that `acp-connector webhooks --help` can name them without importing the rest).
DEFAULT_SECRET_OVERLAP = timedelta(hours=24)
MAX_SECRET_OVERLAP = timedelta(days=7)


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
