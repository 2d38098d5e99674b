"""Every script under bench/ imports: `make bench` runs them only on the benchmark machine, so a name one of them takes
from another that was moved or renamed would otherwise first fail there, half way through a run."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_bench_script_imports(script: str) -> None:
    importlib.import_module(f"bench.{script}")
