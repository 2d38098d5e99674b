"""An ACP client process on its own stdio (the SDK's client, as `ScriptedClient`), for tests that kill the client.

`python -m tests.stdio_client` with its stdin/stdout connected to an agent. It initializes, opens a session, sends
one prompt, holds the elicitation the agent sends, writes `elicitation <id>` to stderr, and waits to be killed.
"""

from __future__ import annotations

import asyncio
import sys

from acp import text_block
from acp.stdio import stdio_streams

from service.testing import ScriptedClient


async def main() -> None:
    reader, writer = await stdio_streams(limit=50 * 1024 * 1024)
    client = ScriptedClient("hold")
    conn = client.connect_streams(reader, writer)
    await client.initialize(conn)
    session = await conn.new_session(cwd="/")
    prompt = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block("go")]))
    elicitation = await client.next_elicitation(within=60)
    print(f"elicitation {elicitation.elicitation_id}", file=sys.stderr, flush=True)
    await prompt  # never answered: the user holds, until this process is killed


if __name__ == "__main__":
    asyncio.run(main())
