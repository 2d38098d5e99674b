"""What the browser is shown of an elicitation: the consent page's facts, and the connected account afterwards."""

from __future__ import annotations

from dataclasses import dataclass

from .accounts import AccountAsk
from .ports import Provider
from .records import ElicitationRecord


@dataclass(frozen=True, slots=True)
class Connected:
    """How a provider's redirect ended well: the elicitation (COMPLETED, or CANCELLED when the agent gave up
    meanwhile), the provider's display name, and the name the user knows the connected account by (or None)."""

    elicitation: ElicitationRecord
    display_name: str
    account_label: str | None


@dataclass(frozen=True, slots=True)
class ConsentView:
    """What the consent page shows; `account`: which account it is for (the user's accounts held at the provider,
    and what the page's account-name field holds at first)."""

    elicitation: ElicitationRecord
    provider: Provider
    agent_name: str
    account: AccountAsk | None = None
