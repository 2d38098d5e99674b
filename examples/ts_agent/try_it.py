"""Try the TypeScript example agent from a terminal, against a running connector (`make run`).

It spawns `node examples/ts_agent/dist/agent.js` over stdio with this environment's SIDECAR_URL, SIDECAR_API_KEY,
AGENT_USER_ISSUER, AGENT_USER_SUBJECT and PROVIDER, sends one prompt, shows the link the agent asks you to open and
opens it in your browser only if you say yes, then prints what the agent answered (the GitHub example's terminal
client, `examples.github_agent.try_it`, with this agent).

    .venv/bin/python -m examples.ts_agent.try_it
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from examples.github_agent.try_it import run_agent

AGENT = Path(__file__).resolve().parent / "dist" / "agent.js"
PASSED_ON = ("SIDECAR_URL", "SIDECAR_API_KEY", "AGENT_USER_ISSUER", "AGENT_USER_SUBJECT", "PROVIDER")

if __name__ == "__main__":
    if not AGENT.exists():
        sys.exit(f"{AGENT} is missing: build it first (npm ci && npx tsc -p . in {AGENT.parent.parent})")
    env = {key: os.environ[key] for key in PASSED_ON if key in os.environ}
    sys.exit(asyncio.run(run_agent(env, ("node", str(AGENT)))))
