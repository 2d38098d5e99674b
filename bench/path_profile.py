"""cProfile of the callback's path alone: from the callback's request reaching its handler to `elicitation/complete`
written on stdio, over sequential connect flows (the path bench/flow.py's latency row measures).

    .venv/bin/python -m bench.path_profile [--flows 300] [--out /tmp/path.prof] [--repo DIR] [--from complete]

The agent (bench/agent.py, its own process, ACP over stdio, SQLite) profiles its event loop's thread (a CPU clock)
only while a callback is on that path: the profiler is enabled when the handler is entered and disabled when the
notification is written. With one flow at a time nothing else of the flow runs meanwhile. The stats are written to
`--out` when the agent exits and the top functions by self and cumulative time printed. `--from complete`: from the
completion's start (after the provider calls) only. A profiler's cost per call inflates code that makes many calls:
read it for where the calls go, and measure a change with bench/agent_ab.py --trace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.driver import run_flows
from bench.flow import connector_agent, mock_provider_and_baseline
from bench.harness import REPO

_profiler: cProfile.Profile | None = None


def install(path: str, start: str = "callback") -> None:
    """In the agent: profile each callback until its notification is written; the stats to `path` at exit. `start`
    "complete": from the completion's start (`BrowserFlow.complete`, after the provider calls) only."""
    import atexit

    from service.acp import authorizer, messages
    from service.core.browser import BrowserFlow
    from service.web.browser import BrowserRoutes

    global _profiler
    profiler = _profiler = cProfile.Profile(time.thread_time)
    on_path = False
    owner: Any = BrowserFlow if start == "complete" else BrowserRoutes
    handler = getattr(owner, start)

    @functools.wraps(handler)
    async def callback(*args: Any, **kwargs: Any) -> Any:
        nonlocal on_path
        on_path = True
        profiler.enable()
        try:
            return await handler(*args, **kwargs)
        finally:
            if on_path:  # the notification was not written (a refused callback): stop here
                on_path = False
                profiler.disable()

    original_send = messages.send_completion

    async def send_completion(link: Any, elicitation_id: str) -> bool:
        nonlocal on_path
        sent = await original_send(link, elicitation_id)
        if on_path:
            on_path = False
            profiler.disable()
        return sent

    setattr(owner, start, callback)
    messages.send_completion = send_completion
    authorizer.send_completion = send_completion  # type: ignore[attr-defined]
    atexit.register(profiler.dump_stats, path)


async def run(repo: Path, flows: int, out: Path, start: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        async with mock_provider_and_baseline() as peers:
            db = f"sqlite+aiosqlite:///{work}/agent.db"
            env = {"BENCH_PATH_PROFILE": str(out), "BENCH_PATH_PROFILE_FROM": start}
            async with connector_agent(peers.provider, db, work, env, repo=repo) as agent:
                await run_flows(agent.flow, flows, 1)
    for _ in range(50):  # the agent writes the stats as it exits
        if os.path.exists(out):  # noqa: ASYNC240 - a stat, while nothing else runs
            break
        await asyncio.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flows", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "path.prof")
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--from", dest="start", choices=["callback", "complete"], default="callback")
    args = parser.parse_args()
    out = args.out.resolve()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(out)
    asyncio.run(run(args.repo.resolve(), args.flows, out, args.start))
    stats = pstats.Stats(str(out))
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"{args.flows} flows: {total * 1000 / args.flows:.3f} ms of the loop thread's CPU a flow on the path")
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
