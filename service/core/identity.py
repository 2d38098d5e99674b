"""Identity: who a user is, as verified by the agent and again in the browser."""

from __future__ import annotations

from dataclasses import dataclass


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
