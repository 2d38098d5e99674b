"""The elicitation state machine: every status change is checked here and nowhere else."""

from __future__ import annotations

from enum import StrEnum


class ElicitationStatus(StrEnum):
    PENDING = "pending"  # created, elicitation/create sent or about to be
    CONSENTED = "consented"  # the client answered accept: the user agreed to open the URL
    VERIFIED = "verified"  # the browser's identity matched the bound identity
    AUTHORIZING = "authorizing"  # the browser was sent to the provider
    COMPLETED = "completed"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class CompletionDelivery(StrEnum):
    """Telling the client that an elicitation completed (`elicitation/complete`), decided once in the database."""

    DELIVERING = "delivering"  # the replica holding the connection took it and is sending
    SENT = "sent"
    UNDELIVERABLE = "undeliverable"  # no live connection could take it (closed, or its replica is gone)


class DeliveryStatus(StrEnum):
    """How a webhook delivery (one event for one endpoint) stands."""

    PENDING = "pending"  # waiting for its next attempt (`next_attempt_at`)
    DELIVERING = "delivering"  # a replica holds the attempt until `lease_until`
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # no 2xx before the delivery was `max_age` old: no more attempts


TERMINAL = frozenset(
    {
        ElicitationStatus.COMPLETED,
        ElicitationStatus.DECLINED,
        ElicitationStatus.CANCELLED,
        ElicitationStatus.EXPIRED,
        ElicitationStatus.FAILED,
    }
)

_OPEN_ENDINGS = frozenset(
    {
        ElicitationStatus.DECLINED,
        ElicitationStatus.CANCELLED,
        ElicitationStatus.EXPIRED,
        ElicitationStatus.FAILED,
    }
)

# The browser may run ahead of the client's answer (a user can open the URL before the client
# relays `accept`), so verification is allowed from PENDING as well as CONSENTED.
ALLOWED: dict[ElicitationStatus, frozenset[ElicitationStatus]] = {
    ElicitationStatus.PENDING: frozenset({ElicitationStatus.CONSENTED, ElicitationStatus.VERIFIED}) | _OPEN_ENDINGS,
    ElicitationStatus.CONSENTED: frozenset({ElicitationStatus.VERIFIED}) | _OPEN_ENDINGS,
    ElicitationStatus.VERIFIED: frozenset({ElicitationStatus.AUTHORIZING, ElicitationStatus.VERIFIED}) | _OPEN_ENDINGS,
    ElicitationStatus.AUTHORIZING: frozenset(
        {ElicitationStatus.COMPLETED, ElicitationStatus.AUTHORIZING, ElicitationStatus.VERIFIED}
    )
    | _OPEN_ENDINGS,
}


# Sending the browser to the provider is two checked steps, -> VERIFIED -> AUTHORIZING, written as one conditional
# UPDATE (tests/test_store.py checks both sets against ALLOWED):
START_FROM = frozenset({ElicitationStatus.PENDING, ElicitationStatus.CONSENTED})  # a first start: no flow exists yet
RESTART_FROM = frozenset({ElicitationStatus.VERIFIED, ElicitationStatus.AUTHORIZING})  # back button, second click


class InvalidTransition(Exception):
    def __init__(self, current: ElicitationStatus, target: ElicitationStatus) -> None:
        super().__init__(f"elicitation cannot go from {current} to {target}")
        self.current = current
        self.target = target


def can_transition(current: ElicitationStatus, target: ElicitationStatus) -> bool:
    return target in ALLOWED.get(current, frozenset())


def check_transition(current: ElicitationStatus, target: ElicitationStatus) -> None:
    if not can_transition(current, target):
        raise InvalidTransition(current, target)
