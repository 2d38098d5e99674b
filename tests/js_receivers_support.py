"""The JavaScript receivers in tests/js_receivers (npm): `eventsource` and `standardwebhooks`, installed with
`npm ci` on first use (one process at a time; `make test` does it ahead), run with node."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

DIRECTORY = Path(__file__).resolve().parent / "js_receivers"
STAMP = DIRECTORY / "node_modules" / ".installed"


def node_command(script: str) -> list[str]:
    """`node tests/js_receivers/<script>`, after `npm ci` when node_modules is missing or older than the lock."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the JavaScript receivers need Node.js and npm on PATH")
    with open(DIRECTORY / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock_file = DIRECTORY / "package-lock.json"
        if not STAMP.exists() or STAMP.stat().st_mtime < lock_file.stat().st_mtime:
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=DIRECTORY, check=True, capture_output=True)
            STAMP.touch()
    return [node, str(DIRECTORY / script)]
