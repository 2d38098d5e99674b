"""`make bench`: every benchmark, each in its own process, then the tables in bench/RESULTS.md.

    .venv/bin/python -m bench [--quick] [--no-write] [--scale]

The tables go between the `<!-- results -->` markers of bench/RESULTS.md; the notes around them are kept.
PostgreSQL runs join in when BENCH_POSTGRES_URL (or CONNECTOR_TEST_POSTGRES_URL) names a server to create a
scratch database on. `--scale` (`make bench BENCH_ARGS=--scale`) adds the PostgreSQL scale benches: `bench/scale.py`, a
million grants and ten million audit and event rows (4-7 minutes; it loads and drops a database of its own; run
`python -m bench.scale --reuse` alone to keep it loaded between runs), `bench/fanout.py` (LISTEN/NOTIFY at 1-8
replicas, 3 minutes) and `bench/pending.py` (100,000 awaited pendings over four processes, about 11 minutes).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from bench.harness import PYTHON, REPO, machine

BENCHES = [
    ("Connect flows against the baseline, latency, concurrency", "bench.flow"),
    ("Under load in one process: SQL per flow, waiters, memory, idle reads", "bench.load"),
    ("Two replicas on PostgreSQL: completion across replicas, one refresh for both", "bench.replicas"),
    ("The token proxy against calling the API directly: sidecar CPU, added latency, throughput", "bench.proxy"),
    ("A proxied call with a DPoP-bound grant beside a Bearer one", "bench.dpop"),
    ("A soak at a steady flow rate: RSS kept per completed flow, and what stays", "bench.soak"),
    ("The command line: CPU of each command against the libraries' floor", "bench.cli"),
]
SCALE = [
    ("At scale on PostgreSQL: 1,000,000 grants, 10,000,000 audit and event rows", "bench.scale"),
    ("LISTEN/NOTIFY fan-out per replica at 1, 2, 4 and 8 replicas", "bench.fanout"),
    ("100,000 awaited pendings across four processes", "bench.pending"),
]
RESULTS = REPO / "bench" / "RESULTS.md"
MARKERS = re.compile(r"(<!-- results -->\n).*?(<!-- /results -->)", re.S)


def run(module: str, quick: bool) -> str:
    args = [PYTHON, "-m", module, *(["--quick"] if quick else [])]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)  # noqa: S603
    if done.returncode != 0:
        return f"`{module}` failed (exit {done.returncode}):\n\n```\n{done.stderr[-3000:]}\n```"
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer flows and levels (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md as it is")
    parser.add_argument("--scale", action="store_true", help="add the PostgreSQL scale benches (about 20 minutes)")
    args = parser.parse_args()
    parts = [f"Run by `make bench`{' --quick' if args.quick else ''} on {machine()}."]
    for title, module in [*BENCHES, *(SCALE if args.scale else [])]:
        print(f"running {module} ...", file=sys.stderr, flush=True)
        output = "\n".join(line for line in run(module, args.quick).splitlines() if not line.startswith("Measured on"))
        parts.append(f"### {title} (`{module.replace('.', '/')}.py`)\n\n{output.strip()}")
    report = "\n\n".join(parts) + "\n"
    print(report)
    if not args.no_write:
        text = RESULTS.read_text()
        if not MARKERS.search(text):
            raise SystemExit(f"{RESULTS} has no <!-- results --> ... <!-- /results --> markers")
        RESULTS.write_text(MARKERS.sub(lambda m: m.group(1) + report + m.group(2), text))
        print(f"written to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
