"""Identity: who a user is, as verified by the agent and again in the browser."""

from __future__ import annotations

from dataclasses import dataclass

from ..util.text import storable

IDENTITY_PART_MAX = 512  # the width of the identity columns (issuer, subject)


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified user identity: the issuer that vouches for the user and the user's subject there.

    Two identities are the same user only when both issuer and subject are equal.
    """

    issuer: str
    subject: str

    def __post_init__(self) -> None:
        if not self.issuer or not self.subject:
            raise ValueError("Identity needs a non-empty issuer and subject")

    def __str__(self) -> str:
        return f"{self.subject}@{self.issuer}"


def identity_problem(identity: Identity) -> str | None:
    """Why `identity` cannot be stored as it is (None: it can): a part longer than `IDENTITY_PART_MAX` characters, or
    holding a NUL or an unpaired surrogate (`util.text.storable`)."""
    for name, part in (("issuer", identity.issuer), ("subject", identity.subject)):
        if len(part) > IDENTITY_PART_MAX:
            return f"{name} is longer than {IDENTITY_PART_MAX} characters"
        if not storable(part):
            return f"{name} holds a NUL or an unpaired surrogate"
    return None
