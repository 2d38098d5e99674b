"""What a mock provider issued: the codes of its authorizations, and the grants its tokens belong to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _IssuedCode:
    client_id: str
    redirect_uri: str
    scope: str  # as granted
    code_challenge: str | None
    nonce: str | None = None
    account: dict[str, Any] | None = None  # whom the user signed in as (None: the provider's `account`)
    used: bool = False


@dataclass
class _Grant:
    """What one authorization granted; every token issued for it (and its refreshes) belongs to it."""

    scope: str
    nonce: str | None
    refreshable: bool
    account: dict[str, Any] | None = None
    tokens: set[str] = field(default_factory=set)
