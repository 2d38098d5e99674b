"""Memory probes a benchmark process answers on signals, so that a driver in another process can read them.

`MemoryProbe(directory).install()` in the measured process (bench/agent.py does it when BENCH_MEMORY_DIR is set):
- SIGUSR2: settle (a full collection, then glibc's `malloc_trim`, so that RSS counts what is held, not what the
  allocator kept of freed memory), then write `settled-<n>` with the RSS;
- SIGUSR1, the first time: settle, count live objects by type, start `tracemalloc`; the second time: settle, and
  write `growers.json`: what was allocated since the first signal and is still alive, by traceback (the largest
  first), and the object types whose count grew.
The driver sends the signal and waits for the file (`await_file`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import linecache
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

FRAMES = 30  # enough to reach the connector's own frame under the SDK's and asyncio's
REPO = str(Path(__file__).resolve().parent.parent) + "/"


def settle() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def object_counts() -> Counter[str]:
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    for marker in ("site-packages/", "lib/python3.11/"):
        if marker in name:
            name = name.split(marker, 1)[1]
            break
    name = name.removeprefix(REPO)
    code = linecache.getline(frame.filename, frame.lineno).strip()
    return f"{name}:{frame.lineno} {code[:90]}"


def growers(snapshot: tracemalloc.Snapshot, top: int) -> list[dict[str, Any]]:
    """The largest live allocations by traceback: size, count, where it was allocated and the innermost frames of
    this repository's code that led there (its caller inside the connector, or the benchmark)."""
    snapshot = snapshot.filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    )
    rows = []
    for stat in snapshot.statistics("traceback")[:top]:
        frames = list(stat.traceback)  # most recent call last
        ours = [f for f in reversed(frames) if f.filename.startswith(REPO + "service/")][:2]
        rows.append(
            {
                "size": stat.size,
                "count": stat.count,
                "allocated_at": _where(frames[-1]),
                "from": [_where(f) for f in ours],
                "stack": [_where(f) for f in reversed(frames[-12:])],  # innermost first
            }
        )
    return rows


class MemoryProbe:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.settled = 0
        self.counts: Counter[str] | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR2, self.on_settle)
        loop.add_signal_handler(signal.SIGUSR1, self.on_trace)

    def on_settle(self) -> None:
        settle()
        self.settled += 1
        _write(self.directory / f"settled-{self.settled}", str(rss_kb()))

    def on_trace(self) -> None:
        settle()
        if self.counts is None:
            self.counts = object_counts()
            tracemalloc.start(FRAMES)
            return
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = object_counts() - self.counts
        report = {
            "traced": sum(s.size for s in snapshot.statistics("filename")),
            "growers": growers(snapshot, 15),
            "objects": grown.most_common(15),
        }
        _write(self.directory / "growers.json", json.dumps(report))


def _write(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(path)  # the reader never sees half a file


async def await_file(path: Path, within: float = 120.0) -> str:
    async with asyncio.timeout(within):
        while not path.exists():  # noqa: ASYNC110, ASYNC240 - another process writes it; no event to await
            await asyncio.sleep(0.05)
    return path.read_text()  # noqa: ASYNC240 - a small local file, once
