"""What a long-running process built to start, moved out of the garbage collector's view."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect, then freeze every object alive now (`gc.freeze`); return how many are frozen.

    A full collection walks every object the collector tracks: after the connector's imports and start that is about
    130,000 (modules, classes, functions, the routes, compiled statements), ~75 ms of CPU on a small VM, and the
    process does nothing else meanwhile. Running flows set one off every few hundred flows (bench/RESULTS.md, "Python's
    garbage collector"). Frozen, those objects are never walked again; collected first, so that no garbage of the
    start is kept for good. For a process the connector owns (`acp-connector serve`): a library leaves its host's
    collector alone, and docs/performance.md tells an agent that embeds the connector how to do the same.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
