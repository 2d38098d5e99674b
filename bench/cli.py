"""How long each `acp-connector` command takes: wall time and CPU time (user + system) of the whole process.

    .venv/bin/python -m bench.cli [--runs N]

Every command runs N times as a fresh process (the console script, as an operator types it) on a scratch SQLite
database migrated once, with the environment's CONNECTOR_* settings left out; the table gives the median of each
and the worst. Targets (issue 29): `--help` and `--version` under 0.3 s, every other command under 1 s of CPU.
CPU time is the figure that means something on a shared machine: wall time also counts the waits for a core.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import PYTHON, REPO, machine
from service.vault import generate_key

COMMANDS = [
    "--version",
    "--help",
    "serve --help",
    "providers list",
    "keys status",
    "grants list",
    "api-keys list",
    "webhooks list",
    "purge --dry-run",
    "migrate",
]
TARGET_SECONDS = {"--version": 0.3, "--help": 0.3, "serve --help": 0.3}  # else 1 s of CPU


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `acp-connector argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - our own console script
        [str(Path(PYTHON).parent / "acp-connector"), *argv], cwd=REPO, env=env, capture_output=True, check=False
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"acp-connector {' '.join(argv)} failed: {done.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default: 7)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        env.update(
            CONNECTOR_DATABASE__URL=f"sqlite+aiosqlite:///{scratch}/bench.db", CONNECTOR_VAULT__KEYS=generate_key()
        )
        measure(["migrate"], env)
        print(f"Measured on {machine()}; {args.runs} runs of each, median (worst).\n")
        print("| command | wall s | CPU s | target |")
        print("|---|---|---|---|")
        for command in COMMANDS:
            runs = [measure(command.split(), env) for _ in range(args.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            target = TARGET_SECONDS.get(command)
            goal = f"< {target} s" if target else "< 1 s CPU"
            met = (statistics.median(walls) < target) if target else (statistics.median(cpus) < 1.0)
            print(
                f"| `acp-connector {command}` | {statistics.median(walls):.2f} ({max(walls):.2f}) | "
                f"{statistics.median(cpus):.2f} ({max(cpus):.2f}) | {goal}: {'met' if met else 'NOT met'} |"
            )


if __name__ == "__main__":
    main()
