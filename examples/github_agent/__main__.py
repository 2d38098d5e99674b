"""`python -m examples.github_agent` (from the repository root) or `python examples/github_agent` (from anywhere)."""

import sys
from pathlib import Path

if not __package__:  # run as a directory: make `examples` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.github_agent.agent import run

sys.exit(run())
