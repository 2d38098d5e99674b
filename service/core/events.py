"""Events about elicitations: what changed, never a secret. Published after the change is committed."""

from __future__ import annotations

from dataclasses import dataclass

from .states import ElicitationStatus


@dataclass(frozen=True, slots=True)
class ElicitationEvent:
    """`elicitation_id` reached `status`; `connection_key` names the client connection that asked for it."""

    elicitation_id: str
    status: ElicitationStatus
    connection_key: str
