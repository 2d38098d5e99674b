"""Timestamps along the completion's path, from inside a connector process, for the replica benches.

    BENCH_TRACE=/tmp/trace.log python -m bench.trace -m examples.github_agent      (or: -m service.cli serve)

Patches a few methods of the connector (before the program imports them) to append `<wall clock> <point> <pid>
<process CPU seconds> <the marking thread's CPU seconds>` to the file BENCH_TRACE names, one `write` per point
(O_APPEND: several processes may share the file), then runs the module as `__main__` (bench/agent.py installs it
itself when BENCH_TRACE is set). The connector's code is not changed; a point costs one small write. The points,
in the order a cross-replica completion passes them:

  callback         the callback's request reached the replica's handler (after the ASGI stack)
  claimed          the callback's flow claimed with its checks (one statement)
  token.start/end  the provider's token call (`ProviderGateway.redeem`: code exchange and the account's identity)
  exchange.end     the code exchanged (the token endpoint's answer; the account's identity is read after it)
  commit           the grant stored and the elicitation completed (the callback's transaction committed)
  notify.start/end the NOTIFY sent on the listening connection (one round trip)
  wake             a notification heard by another replica (asyncpg's listener callback)
  feed             that replica's read of the event log done, or the event taken from the notification without
                   the read (`OutboxFeed.follow`): the event handed to the waiters and listeners
  claim            the telling of the completion taken (a conditional update)
  push.start/end   `elicitation/complete` written on the ACP connection
  answered         the callback's handler returned its redirect
  settled          the telling recorded as sent (with its audit row)

With BENCH_TRACE_FINE=1 also: claim_sql.start/end around the callback's claim statement (`claim_with_elicitation`),
finish.start/end around the completion (`Elicitations.finish`) and end_sql.start/end around its statements
(`end_with_first_grant`).
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any

_fd: int | None = None


def mark(point: str) -> None:
    if _fd is not None:
        line = f"{time.time():.6f} {point} {os.getpid()} {time.process_time():.6f} {time.thread_time():.6f}\n"
        os.write(_fd, line.encode())


def _around(owner: Any, name: str, start: str | None, end: str | None) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    async def traced(*args: Any, **kwargs: Any) -> Any:
        if start:
            mark(start)
        result = await original(*args, **kwargs)
        if end:
            mark(end)
        return result

    setattr(owner, name, traced)


def retarget(path: str) -> None:
    """Write the marks to `path` from now on."""
    global _fd
    if _fd is not None:
        os.close(_fd)
    _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def install(path: str) -> None:
    retarget(path)

    from service.acp import messages
    from service.core import browser
    from service.core.browser import BrowserFlow
    from service.core.lifecycle import Elicitations
    from service.events.feed import OutboxFeed
    from service.events.pg import PgBus
    from service.oauth.gateway import ProviderGateway
    from service.store.notify import PgListener
    from service.web.browser import BrowserRoutes

    _around(BrowserRoutes, "callback", "callback", "answered")
    if os.environ.get("BENCH_TRACE_FINE"):
        from service.store.elicitations import ElicitationRepository
        from service.store.flows import FlowRepository

        _around(FlowRepository, "claim_with_elicitation", "claim_sql.start", "claim_sql.end")
        _around(ElicitationRepository, "end_with_first_grant", "end_sql.start", "end_sql.end")
        _around(Elicitations, "finish", "finish.start", "finish.end")
    _around(ProviderGateway, "redeem", "token.start", "token.end")
    _around(ProviderGateway, "exchange_code", None, "exchange.end")
    _around(BrowserFlow, "complete", None, "commit")
    _around(PgListener, "notify", "notify.start", "notify.end")
    _around(OutboxFeed, "catch_up", None, "feed")
    _around(Elicitations, "claim_telling", None, "claim")
    _around(Elicitations, "settle_telling", None, "settled")
    original_send = messages.send_completion

    async def send_completion(link: Any, elicitation_id: str) -> bool:
        mark("push.start")
        sent = await original_send(link, elicitation_id)
        mark("push.end")
        return sent

    messages.send_completion = send_completion
    claim_for_callback = browser.claim_for_callback

    async def claimed(*args: Any, **kwargs: Any) -> Any:
        result = await claim_for_callback(*args, **kwargs)
        mark("claimed")
        return result

    browser.claim_for_callback = claimed  # type: ignore[assignment]
    from service.acp import authorizer

    authorizer.send_completion = send_completion  # type: ignore[attr-defined]
    follow = OutboxFeed.follow

    def followed(self: OutboxFeed, event: Any) -> bool:
        taken = follow(self, event)
        if taken:
            mark("feed")
        return taken

    OutboxFeed.follow = followed  # type: ignore[method-assign]
    received = PgBus._received

    def heard(self: PgBus, payload: str) -> None:
        mark("wake")
        received(self, payload)

    PgBus._received = heard  # type: ignore[method-assign]


def main() -> None:
    path = os.environ.get("BENCH_TRACE")
    if path:
        install(path)
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: python -m bench.trace -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
