"""`freeze_startup_objects`: what is alive is frozen (out of every later collection's walk), garbage is not kept."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.util.heap import freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    try:
        yield
    finally:
        gc.unfreeze()  # this test process's objects go back to the collector


def test_what_is_alive_is_frozen_and_garbage_is_collected_first(unfrozen_after: None) -> None:
    kept = _Node()
    cycle_a, cycle_b = _Node(), _Node()
    cycle_a.other, cycle_b.other = cycle_b, cycle_a  # garbage only a collection frees
    garbage = weakref.ref(cycle_a)
    del cycle_a, cycle_b

    frozen = freeze_startup_objects()

    assert garbage() is None  # collected, not frozen for good
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # out of the collector's generations
    gc.unfreeze()
    assert any(obj is kept for obj in gc.get_objects())
