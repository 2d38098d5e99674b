"""Refreshing ahead: the access tokens of grants this replica used lately are refreshed before they expire.

Off by default (`[grants] proactive_refresh`). Every `interval` the replica looks at the grants it used within
`used_within` seconds whose token, as it holds it, expires within `ahead` seconds, and refreshes them, at most
`concurrency` at a time, through `TokenAccess.refresh_ahead`: the grant's lock and the database's refresh lock, so
when several replicas used one grant a single refresh reaches the provider and the others reuse what it stored.
A failure is what a refresh on use would have met (a dead grant is marked `needs_user`, a transient failure backs
off across replicas); it is logged here, and the next pass tries what is still due.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from service.core.errors import ConnectorError
from service.core.health import ProactivePolicy
from service.util.periodic import Periodic

from .access import TokenAccess

log = logging.getLogger("service.tokens")

MAX_BACKOFF_SECONDS = 300.0


class ProactiveRefresh:
    def __init__(self, tokens: TokenAccess, policy: ProactivePolicy) -> None:
        self.tokens = tokens
        self.policy = policy
        self._loop = Periodic(
            self.run_once,
            interval=lambda: policy.interval,
            max_backoff=MAX_BACKOFF_SECONDS,
            name="connector-proactive-refresh",
            what="refresh ahead",
            log=log,
        )

    @property
    def running(self) -> bool:
        return self._loop.running

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def run_once(self) -> int:
        """One pass: refresh what is due ahead; how many grants were looked at closely (refreshed or reused)."""
        since = self.tokens.now() - timedelta(seconds=self.policy.used_within)
        due = [
            (grant_id, provider)
            for grant_id, provider in self.tokens.used_since(since).items()
            if self.tokens.expiring_within(grant_id, self.policy.ahead)
        ]
        if not due:
            return 0
        slots = asyncio.Semaphore(self.policy.concurrency)
        await asyncio.gather(*(self._refresh(grant_id, provider, slots) for grant_id, provider in due))
        return len(due)

    async def _refresh(self, grant_id: str, provider_name: str, slots: asyncio.Semaphore) -> None:
        async with slots:
            try:
                provider = await self.tokens.providers.resolve(provider_name)
                await self.tokens.refresh_ahead(grant_id, provider, self.policy.ahead)
            except ConnectorError as exc:  # the grant's health records it; the next use or pass tells the rest
                log.info(
                    "refresh ahead did not succeed: %s",
                    exc.code,
                    extra={"grant_id": grant_id, "provider": provider_name},
                )
