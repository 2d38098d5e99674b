"""Memory probes a benchmark process answers on signals, so that a driver in another process can read them.

`MemoryProbe(directory).install()` in the measured process (bench/agent.py does it when BENCH_MEMORY_DIR is set):
- SIGUSR2: settle (a full collection, then glibc's `malloc_trim`, so that RSS counts what is held, not what the
  allocator kept of freed memory), then write `settled-<n>` with the RSS (and `parts-<n>`, JSON: anonymous and
  file-backed RSS, what SQLite's allocator holds, Python's live blocks);
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
import inspect
import json
import linecache
import reprlib
import signal
import sys
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


def sqlite_kb() -> int:
    """What SQLite's own allocator holds in this process (page caches, schemas, prepared statements), in KB."""
    try:
        import _sqlite3

        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
        used.restype = ctypes.c_int64
        return int(used()) // 1024
    except (OSError, AttributeError, ImportError):
        return -1


def sqlite_connections() -> dict[str, int]:
    """SQLite's memory by use, summed over this process's open connections (`sqlite3_db_status`; the handle is read
    from the `sqlite3.Connection` object, the pointer that follows its object header): page caches, schemas,
    prepared statements."""
    import _sqlite3
    import sqlite3

    try:
        status = ctypes.CDLL(_sqlite3.__file__).sqlite3_db_status
    except (OSError, AttributeError):
        return {}
    counter = ctypes.POINTER(ctypes.c_int)
    status.argtypes = [ctypes.c_void_p, ctypes.c_int, counter, counter, ctypes.c_int]
    totals = {"sqlite_connections": 0, "sqlite_cache_kb": 0, "sqlite_schema_kb": 0, "sqlite_statements_kb": 0}
    for conn in gc.get_objects():
        if not isinstance(conn, sqlite3.Connection):
            continue
        handle = ctypes.c_void_p.from_address(id(conn) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
        if not handle:
            continue
        totals["sqlite_connections"] += 1
        for op, name in ((1, "sqlite_cache_kb"), (2, "sqlite_schema_kb"), (3, "sqlite_statements_kb")):
            current, highest = ctypes.c_int(), ctypes.c_int()
            if status(handle, op, ctypes.byref(current), ctypes.byref(highest), 0) == 0:
                totals[name] += current.value // 1024
    return totals


def parts() -> dict[str, int]:
    """Where the RSS is: anonymous and file-backed pages, SQLite's allocator, Python's live blocks."""
    status = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
            name, value = line.split()[:2]
            status[name.rstrip(":")] = int(value)
    return {
        "rss_kb": status.get("VmRSS", -1),
        "anon_kb": status.get("RssAnon", -1),
        "file_kb": status.get("RssFile", -1),
        "sqlite_kb": sqlite_kb(),
        "python_blocks": sys.getallocatedblocks(),
        **sqlite_connections(),
    }


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


def _describe(o: object) -> str:
    kind = f"{type(o).__module__}.{type(o).__qualname__}"
    if isinstance(o, dict):
        return f"{kind} of {len(o)} {sorted(map(str, o))[:4]}"
    return f"{kind} {reprlib.repr(o)}"


def holders(known: set[int], types: list[str], samples: int = 8) -> dict[str, list[list[str]]]:
    """For the object types that grew most: a few of the objects created since tracing began, each with what holds
    it (the referrers, and theirs: two levels), to name the container that keeps them."""
    found: dict[str, list[list[str]]] = {}
    for name in types:
        new = [
            o for o in gc.get_objects() if id(o) not in known and f"{type(o).__module__}.{type(o).__qualname__}" == name
        ]
        step = max(1, len(new) // samples)
        rows = []
        for o in new[::step][:samples]:
            chain = [_describe(o)]
            for holder in gc.get_referrers(o)[:3]:
                if holder is new or inspect.isframe(holder):
                    continue
                chain.append("  <- " + _describe(holder))
                for outer in gc.get_referrers(holder)[:2]:
                    if outer is new or inspect.isframe(outer):
                        continue
                    chain.append("      <- " + _describe(outer))
            rows.append(chain)
        del new
        found[name] = rows
    return found


class MemoryProbe:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.settled = 0
        self.counts: Counter[str] | None = None
        self.known: set[int] = set()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR2, self.on_settle)
        loop.add_signal_handler(signal.SIGUSR1, self.on_trace)

    def on_settle(self) -> None:
        settle()
        self.settled += 1
        _write(self.directory / f"parts-{self.settled}", json.dumps(parts()))
        _write(self.directory / f"settled-{self.settled}", str(rss_kb()))

    def on_trace(self) -> None:
        settle()
        if self.counts is None:
            self.counts = object_counts()
            self.known = {id(o) for o in gc.get_objects()}
            tracemalloc.start(FRAMES)
            return
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = object_counts() - self.counts
        report = {
            "traced": sum(s.size for s in snapshot.statistics("filename")),
            "growers": growers(snapshot, 15),
            "objects": grown.most_common(15),
            "holders": holders(self.known, [name for name, _ in grown.most_common(3)]),
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
