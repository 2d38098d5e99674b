"""Building the TypeScript package (`clients/typescript`) and the example agent on it (`examples/ts_agent`) for tests:
`npm ci` and `tsc`, once per change of a lock file or a source, one build at a time across test workers."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clients" / "typescript"
EXAMPLE = ROOT / "examples" / "ts_agent"


def _inputs(directory: Path) -> list[Path]:
    return [
        directory / "package-lock.json",
        *directory.glob("tsconfig*.json"),
        *sorted((directory / "src").rglob("*.ts")),
    ]


def built_example() -> Path:
    """The compiled example agent's path, with the package it uses built first; skips without Node.js and npm."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the TypeScript package and example need Node.js 20+ and npm")
    # pytest-xdist may run TypeScript tests on two workers: `npm ci` in one would delete node_modules under an
    # agent the other runs.
    with (EXAMPLE / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = EXAMPLE / ".installed"
        newest = max(path.stat().st_mtime for path in [*_inputs(PACKAGE), *_inputs(EXAMPLE)])
        if not stamp.exists() or stamp.stat().st_mtime < newest or not (EXAMPLE / "dist" / "agent.js").exists():
            for cwd, command in (
                (PACKAGE, ["npm", "ci", "--no-audit", "--no-fund"]),
                (PACKAGE, ["npm", "run", "build"]),
                (EXAMPLE, ["npm", "ci", "--no-audit", "--no-fund"]),
                (EXAMPLE, ["npx", "tsc", "-p", "."]),
            ):
                subprocess.run(command, cwd=cwd, check=True, capture_output=True, timeout=300)
            stamp.touch()
    return EXAMPLE / "dist" / "agent.js"
