"""`python -m examples.mcp_server [stdio|http]` (from the repository root) or `python examples/mcp_server ...`."""

import sys
from pathlib import Path

if not __package__:  # run as a directory: make `examples` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.mcp_server.server import run

sys.exit(run(sys.argv[1:]))
