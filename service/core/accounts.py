"""Several accounts per provider: which of a user's grants at a provider a call means, and what each account is called.

A user may hold grants for more than one account at a provider (work and personal GitHub): one grant per account,
keyed by the provider's account id. A call names the account it means with `account`: the provider's account id, the
label the user gave it on the consent page ("work"), or the provider's own name for it (a login, an e-mail address),
compared without regard to case. Without `account`, a user holding one account there is answered as before; one
holding several gets `AccountChoiceNeeded`, naming them by label, rather than one chosen for them.

An account's label is the name the user typed on the consent page, else (asked again) the one it had, else the
provider's profile name; it is unique among the user's accounts at the provider: a clash gets " (2)", " (3)" added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import AccountChoiceNeeded, FlowRefused

if TYPE_CHECKING:
    from .records import GrantRecord


class Account(Protocol):
    """A grant as far as which account it is: `GrantRecord`, or `GrantInfo` as an agent learns it."""

    @property
    def account_id(self) -> str: ...
    @property
    def account_label(self) -> str | None: ...
    @property
    def account_name(self) -> str | None: ...


A = TypeVar("A", bound=Account)

LABEL_MAX_LENGTH = 64
ACCOUNT_MAX_LENGTH = 255  # an account id or label as a call may name it
NO_NAME = "an unnamed account"
# A label is shown on pages and sent to agents; pages escape it, and it may not carry markup to begin with.
_MARKUP = frozenset("<>")


@dataclass(frozen=True, slots=True)
class Named:
    """What an account is called as it is connected: the label the user gave (None: none) and the provider's
    profile name for it (None: the provider named none)."""

    given: str | None = None
    profile: str | None = None

    @property
    def shown(self) -> str | None:
        """How the page after the provider names it: "work (alice@example.com)", "work", "alice@example.com"."""
        if self.given is None or self.profile is None or self.given == self.profile:
            return self.given or self.profile
        return f"{self.given} ({self.profile})"


UNNAMED = Named()
LabelOf = Callable[[str], str | None]  # an elicitation id -> the label its browser gave on the consent page


def no_label(elicitation_id: str) -> str | None:
    return None


def clean_label(raw: str | None) -> str | None:
    """The label the user typed, spaces trimmed and collapsed (None when empty); FlowRefused `invalid_account_label`
    for one that is too long, holds a control character, or markup."""
    if raw is None:
        return None
    label = " ".join(raw.split())
    if not label:
        return None
    if len(label) > LABEL_MAX_LENGTH:
        raise FlowRefused("invalid_account_label", detail={"problem": f"at most {LABEL_MAX_LENGTH} characters"})
    if not label.isprintable() or _MARKUP & set(label):
        raise FlowRefused("invalid_account_label", detail={"problem": "letters, digits, spaces and punctuation only"})
    return label


def check_account(account: str) -> str:
    """The account a call names, as given; FlowRefused `invalid_account` for an empty, overlong or unprintable one."""
    if not account.strip() or len(account) > ACCOUNT_MAX_LENGTH or not account.isprintable():
        raise FlowRefused("invalid_account", detail={"problem": f"1 to {ACCOUNT_MAX_LENGTH} printable characters"})
    return account


def shown(grant: Account) -> str:
    """What an account is called where people and agents read it: its label, its profile name, or neither."""
    return grant.account_label or grant.account_name or NO_NAME


def accounts(grants: Iterable[A]) -> list[A]:
    """One grant per account (the first of each: newest first in, newest first out)."""
    seen: dict[str, A] = {}
    for grant in grants:
        seen.setdefault(grant.account_id, grant)
    return list(seen.values())


def named(grants: Sequence[A], account: str) -> list[A]:
    """The grants of the account `account` names: by account id first, else by label, else by profile name."""
    by_id = [grant for grant in grants if grant.account_id == account]
    if by_id:
        return by_id
    wanted = account.casefold()
    for attribute in ("account_label", "account_name"):
        found = [grant for grant in grants if (getattr(grant, attribute) or "").casefold() == wanted]
        if found:
            return found
    return []


def choose(grants: Sequence[A], account: str | None, display_name: str) -> list[A]:
    """The grants (newest first) a call for `account` means: those of the named account (none when it is not held),
    or all of them when the user holds at most one account. AccountChoiceNeeded when the call named none and the
    user holds several (FlowRefused `invalid_account` for an account no grant could be named by)."""
    if account is not None:
        return named(grants, check_account(account))
    held = accounts(grants)
    if len(held) > 1:
        raise AccountChoiceNeeded(display_name, [shown(grant) for grant in held])
    return list(grants)


def unique_label(label: str | None, account_id: str, others: Iterable[Account]) -> str | None:
    """`label`, with " (2)", " (3)", ... added when another of the user's accounts at the provider is called so."""
    if label is None:
        return None
    taken = {
        name.casefold()
        for grant in others
        if grant.account_id != account_id
        for name in (grant.account_label, grant.account_name)
        if name
    }
    candidate, number = label, 1
    while candidate.casefold() in taken:
        number += 1
        suffix = f" ({number})"
        candidate = label[: LABEL_MAX_LENGTH - len(suffix)] + suffix
    return candidate


def label_for(
    given: str | None,
    previous: GrantRecord | None,
    profile_name: str | None,
    account_id: str,
    others: Iterable[Account],
) -> str | None:
    """The label an account's grant is stored with: the one the user gave, else the one it had, else its profile
    name (shortened), made unique among the user's other accounts there."""
    label = given or (previous.account_label if previous is not None else None)
    if label is None and profile_name:
        label = profile_name[:LABEL_MAX_LENGTH]
    return unique_label(label, account_id, others)


@dataclass(frozen=True, slots=True)
class AccountAsk:
    """Which account an elicitation is for, as its request found the user's grants at the provider: what the agent
    named (`asked`), the accounts held then (by label), and either the provider's name for the account asked again
    (`login_hint`) or that it is a new one (`new`: the provider is asked to let the user pick the account)."""

    asked: str | None = None
    held: tuple[str, ...] = ()
    login_hint: str | None = None
    new: bool = False

    @property
    def suggested_label(self) -> str | None:
        """What the consent page's name field holds at first: the account the agent named, when it is a new one
        ("work"); else nothing (an account asked again keeps its label)."""
        if not self.new or self.asked is None:
            return None
        try:
            return clean_label(self.asked[:LABEL_MAX_LENGTH])
        except FlowRefused:
            return None

    def to_json(self) -> dict[str, object]:
        return {"asked": self.asked, "held": list(self.held), "login_hint": self.login_hint, "new": self.new}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AccountAsk:
        return cls(data.get("asked"), tuple(data.get("held") or ()), data.get("login_hint"), bool(data.get("new")))


def account_ask(grants: Sequence[GrantRecord], chosen: Sequence[GrantRecord], asked: str | None) -> AccountAsk | None:
    """What a new elicitation records of its account (None: a first account, none named: nothing to say)."""
    if not grants and asked is None:
        return None
    held = tuple(shown(grant) for grant in accounts(grants))
    if chosen:
        return AccountAsk(asked, held, login_hint=chosen[0].account_name)
    return AccountAsk(asked, held, new=True)
