"""How long each `acp-connector` command takes: wall time and CPU time (user + system) of the whole process.

    .venv/bin/python -m bench.cli [--runs N] [--quick]

Every command runs N times as a fresh process (the console script, as an operator types it) on a scratch SQLite
database migrated once, with the environment's CONNECTOR_* settings left out; the table gives the median of each
and the worst. Targets (issue 29): `--help` and `--version` under 0.3 s, every other command under 1 s of CPU.
CPU time is the figure that means something on a shared machine: wall time also counts the waits for a core.
Beside each command, its CPU against a floor measured in the same run: a bare interpreter importing the libraries a
database command cannot do without (pydantic-settings, SQLAlchemy's asyncio engine, aiosqlite), which this
machine's speed moves as much as the commands (it varies by 2.5x from hour to hour).
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
FLOOR = [PYTHON, "-c", "import pydantic_settings, sqlalchemy.ext.asyncio, aiosqlite"]


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `acp-connector argv`."""
    return run_process([str(Path(PYTHON).parent / "acp-connector"), *argv], env)


def run_process(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, check=False)  # noqa: S603 - ours
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default: 7)")
    parser.add_argument("--quick", action="store_true", help="2 runs of each (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.runs = 2
    with tempfile.TemporaryDirectory() as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        env.update(
            CONNECTOR_DATABASE__URL=f"sqlite+aiosqlite:///{scratch}/bench.db", CONNECTOR_VAULT__KEYS=generate_key()
        )
        measure(["migrate"], env)
        print(f"Measured on {machine()}; {args.runs} runs of each, median (worst).\n")
        print("| command | wall s | CPU s | CPU / floor | target |")
        print("|---|---|---|---|---|")
        floors: list[float] = []
        for command in COMMANDS:
            runs = []
            for _ in range(args.runs):  # the floor interleaved with the command: both see the same machine
                floors.append(run_process(FLOOR, env)[1])
                runs.append(measure(command.split(), env))
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            target = TARGET_SECONDS.get(command)
            goal = f"< {target} s" if target else "< 1 s CPU"
            met = (statistics.median(walls) < target) if target else (statistics.median(cpus) < 1.0)
            print(
                f"| `acp-connector {command}` | {statistics.median(walls):.2f} ({max(walls):.2f}) | "
                f"{statistics.median(cpus):.2f} ({max(cpus):.2f}) | "
                f"{statistics.median(cpus) / statistics.median(floors):.2f}x | {goal}: {'met' if met else 'NOT met'} |"
            )
        print(
            f"\nFloor (`python -c 'import pydantic_settings, sqlalchemy.ext.asyncio, aiosqlite'`): "
            f"{statistics.median(floors):.2f} s CPU, median of {len(floors)} runs."
        )


if __name__ == "__main__":
    main()
