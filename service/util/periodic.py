"""`Periodic`: one background task that does a piece of work every interval and never stops on an error.

A failed run is logged (with its traceback) and the next one waits longer, the interval doubling up to
`max_backoff`; the first run that works after failures is logged too. The sweeper and the event-log feed run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    def __init__(
        self,
        work: Callable[[], Awaitable[object]],
        *,
        interval: Callable[[], float],
        max_backoff: float,
        name: str,
        what: str,
        log: logging.Logger,
        idle: Callable[[], bool] = lambda: False,
    ) -> None:
        """`work` runs every `interval()` seconds, except when `idle()` says there is nothing to do; `what` names
        it in the log lines ("<what> failed (2 in a row)"), `name` names the task."""
        self._work = work
        self._interval = interval
        self._max_backoff = max_backoff
        self._name = name
        self._what = what
        self._log = log
        self._idle = idle
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Whether the background task is alive (it stops only when closed)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def delay(self, failures: int) -> float:
        """How long to wait before the next run, after `failures` failed runs in a row."""
        interval = self._interval()
        return interval if failures == 0 else min(interval * 2 ** min(failures, 10), self._max_backoff)

    async def _run(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self.delay(failures))
            if self._idle():
                continue
            try:
                await self._work()
            except Exception:
                failures += 1
                self._log.warning("%s failed (%d in a row); retrying in a moment", self._what, failures, exc_info=True)
            else:
                if failures:
                    self._log.info("%s works again after %d failed attempts", self._what, failures)
                failures = 0
