"""Building the TypeScript package (`clients/typescript`) and the examples on it (the ACP agent `examples/ts_agent`,
the MCP server `examples/mcp_ts_server`) for tests: `npm ci` and `tsc`, once per change of a lock file or a source,
one build at a time across test workers."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clients" / "typescript"
EXAMPLE = ROOT / "examples" / "ts_agent"
MCP_EXAMPLE = ROOT / "examples" / "mcp_ts_server"


def _newest(paths: list[Path]) -> float:
    return max(path.stat().st_mtime for path in paths if path.exists())


def _sources(directory: Path) -> list[Path]:
    return [*directory.glob("tsconfig*.json"), *sorted((directory / "src").rglob("*.ts"))]


def _install(directory: Path) -> None:
    """`npm ci` when the lock file is newer than the stamp `make test` also keeps (node_modules/.installed)."""
    stamp = directory / "node_modules" / ".installed"
    if not stamp.exists() or stamp.stat().st_mtime < (directory / "package-lock.json").stat().st_mtime:
        npm_ci = ["npm", "ci", "--no-audit", "--no-fund"]  # npm from PATH, as `make test` runs it
        subprocess.run(npm_ci, cwd=directory, check=True, capture_output=True, timeout=300)
        stamp.touch()


def _build(directory: Path, output: Path, command: list[str]) -> None:
    """`command` when a source is newer than `output`."""
    if not output.exists() or output.stat().st_mtime < _newest(_sources(directory)):
        subprocess.run(command, cwd=directory, check=True, capture_output=True, timeout=300)
        output.touch()


def built_example(example: Path = EXAMPLE, entry: str = "agent.js") -> Path:
    """The compiled example's entry point (`example`/dist/`entry`), with the package it uses built first; skips
    without Node.js and npm."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the TypeScript package and example need Node.js 20+ and npm")
    # pytest-xdist may run TypeScript tests on two workers: one builds, the other waits for it (one lock for both
    # examples, since both build the package).
    with (EXAMPLE / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install(PACKAGE)
        _build(PACKAGE, PACKAGE / "dist" / "index.js", ["npm", "run", "build"])
        _install(example)
        _build(example, example / "dist" / entry, ["npx", "tsc", "-p", "."])
    return example / "dist" / entry
