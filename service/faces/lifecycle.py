"""What a protocol face (`AcpAuthorizer`, `McpAuthorizer`) needs from the elicitation lifecycle, wherever it runs.

A face speaks its protocol on the client's connection; the lifecycle (grants, elicitation rows, their one terminal
state) is behind the `Lifecycle` port. The embedded connector implements it in process over `Elicitations`
(`service.faces.embedded`); the sidecar client implements it over the `/v1` HTTP API (`service.client`). Each face
is written once over the port, so the embedded connector and the sidecar client answer alike.

A lifecycle hands out a handle per elicitation it creates (`H`: what it needs to find it again, with the id,
message and connection key the face uses) and resolves each waiter with an end of its own kind (`E`: what it
needs to tell the outcome), or with None when the face wakes the waiter because the connection ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from service.core.answers import ClientAnswer
from service.core.identity import Identity
from service.core.lifecycle import GrantsSeen
from service.core.outcomes import CLIENT_DISCONNECTED, AuthorizationOutcome, AuthorizationStatus, StopCause
from service.core.scopes import ElicitationScope


@dataclass(frozen=True, slots=True)
class AuthorizationAsk:
    """What the agent asked for: a grant of `user` at `provider` covering `scopes` (None: the provider's
    defaults, resolved by the lifecycle), asked in `scope`."""

    user: Identity
    provider: str
    scopes: Sequence[str] | None
    scope: ElicitationScope
    message: str | None
    ask_again: bool
    connection: Mapping[str, str] | None = None  # per-connection values for the provider's URLs
    account: str | None = None  # the account meant: an account id or label (`service.core.accounts`)
    # The grants the in-process `settled` check read, for the `create` that follows (not read twice).
    seen: GrantsSeen = field(default_factory=GrantsSeen, compare=False, repr=False)


class Handle(Protocol):
    """An elicitation as a face needs it."""

    @property
    def id(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def connection_key(self) -> str:
        """The key of the client connection it was created for (e.g. `AcpLink.key`)."""
        ...


H = TypeVar("H", bound=Handle)
E = TypeVar("E")

# Told when an elicitation completed: (elicitation id, connection key, whether this process created it).
CompletionListener = Callable[[str, str, bool], None]


class Lifecycle(Protocol[H, E]):
    def display_name(self, provider: str) -> str | None:
        """What people are shown for `provider` (None when not known here)."""
        ...

    async def settled(self, ask: AuthorizationAsk) -> AuthorizationOutcome | None:
        """The answer that needs nobody asked (`already_authorized`, `narrowed`), or None."""
        ...

    async def unsupported(self, ask: AuthorizationAsk) -> None:
        """Note that the client cannot be asked (no URL-mode elicitation)."""
        ...

    async def create(self, ask: AuthorizationAsk, connection_key: str) -> H | AuthorizationOutcome:
        """A new pending elicitation for the connection `connection_key`, or the outcome when a grant settled the
        request meanwhile."""
        ...

    def url(self, handle: H) -> str:
        """The URL the client is asked to open."""
        ...

    def waiter(self, handle: H) -> AbstractContextManager[asyncio.Future[E | None]]:
        """A future resolved when the elicitation ends; enter it before the client is asked."""
        ...

    async def answered(self, handle: H, answer: ClientAnswer) -> AuthorizationOutcome | None:
        """Record the client's answer: the outcome it led to, or None for accept (the browser decides then)."""
        ...

    def kept(self, handle: H) -> H:
        """`handle` as a call keeps it while the user is in the browser (thousands may wait at once): what its end
        needs, without the question's text."""
        ...

    async def outcome_of_end(self, handle: H, end: E) -> AuthorizationOutcome:
        """The outcome an ended elicitation's end tells."""
        ...

    async def cancel(self, handle: H, cause: StopCause, *, request_cancelled: bool | None = None) -> bool:
        """End an open elicitation as cancelled for `cause` (`request_cancelled`: whether our outstanding
        `elicitation/create` was withdrawn); a flow the user already took to the provider still stores its grant.
        False when something else ended it first."""
        ...

    async def current_outcome(self, handle: H) -> AuthorizationOutcome:
        """The outcome of an elicitation that has ended."""
        ...

    async def tell_completion(self, elicitation_id: str, send: Callable[[], Awaitable[bool]]) -> None:
        """Tell the client the elicitation completed (`send`, False when the connection is gone) once, whoever asks
        again."""
        ...

    def on_completed(self, listener: CompletionListener) -> None:
        """Have `listener` hear elicitations that complete while nobody here waits for them."""
        ...


async def abandoned(lifecycle: Lifecycle[H, E], handle: H, provider: str) -> AuthorizationOutcome:
    """The outcome when the connection ended while its work waited: the elicitation is cancelled
    (`client_disconnected`; a flow the user already took to the provider still stores its grant, nothing is sent), or
    what ended it first."""
    if await lifecycle.cancel(handle, StopCause.CLIENT_DISCONNECTED):
        return AuthorizationOutcome(
            AuthorizationStatus.DISCONNECTED,
            provider,
            handle.id,
            reason=CLIENT_DISCONNECTED,
            provider_display_name=lifecycle.display_name(provider),
        )
    return await lifecycle.current_outcome(handle)
