"""Python's garbage collections in a benchmark process: how many, how long, and when.

`GcProbe(path).install()` in the measured process (bench/agent.py does it when BENCH_GC_LOG is set) appends one
line per collection to `path` when it ends: `<perf_counter at start> <seconds> <generation> <collected> <objects>`
(objects: those the collector tracks, after a full collection; 0 after the others). On Linux
`time.perf_counter` is CLOCK_MONOTONIC, the same clock in every process, so a driver can match collections with
the flows it timed (`collections`, `during`).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Collection:
    start: float  # perf_counter
    seconds: float
    generation: int
    collected: int


class GcProbe:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self.started = now
            return
        generation = info["generation"]
        heap = len(gc.get_objects()) if generation == 2 else 0  # counted after the timing: what a full one walks
        line = f"{self.started:.6f} {now - self.started:.6f} {generation} {info['collected']} {heap}\n"
        os.write(self.fd, line.encode())


def collections(path: Path, since: float = 0.0, until: float = float("inf")) -> list[Collection]:
    """The collections `path` logged that started in [since, until)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        start, seconds, generation, collected, _ = line.split()
        if since <= float(start) < until:
            found.append(Collection(float(start), float(seconds), int(generation), int(collected)))
    return found


def during(logged: list[Collection], start: float, end: float) -> list[Collection]:
    """The collections that overlap [start, end)."""
    return [c for c in logged if c.start < end and c.start + c.seconds > start]
