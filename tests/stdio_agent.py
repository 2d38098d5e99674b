"""The connector's test agent (`acp_peers.ConnectorAgent`) as an ACP agent process over stdio.

`python -m tests.stdio_agent` from the repository root. Configured like any connector (`CONNECTOR_*`), plus
`TEST_AGENT_DEADLINE` (seconds): the agent's own `asyncio.timeout` around `request_authorization`, which the client
can run out at once with the `_test/time_out` notification. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import gc
import os
from contextlib import suppress

from acp import run_agent

from service import Connector
from service.logs import configure
from service.web.server import make_server

from .acp_peers import ConnectorAgent


async def main() -> None:
    connector = Connector.from_config(os.environ.get("CONNECTOR_CONFIG") or None)
    configure(connector.settings.log_format)
    try:
        await connector.start()
        server = make_server(connector.asgi_app(), connector.settings.server.host, connector.settings.server.port)
        web = asyncio.create_task(server.serve())
        while not server.started:
            if web.done():
                web.result()
            await asyncio.sleep(0.01)
        agent = ConnectorAgent(connector, connector.verifier.user())
        deadline = os.environ.get("TEST_AGENT_DEADLINE")
        agent.deadline = float(deadline) if deadline else None
        try:
            await run_agent(agent, use_unstable_protocol=True)  # type: ignore[arg-type]
        finally:
            web.cancel()
            with suppress(asyncio.CancelledError):
                await web
    finally:
        await connector.close()


if __name__ == "__main__":
    asyncio.run(main())
    gc.freeze()  # as the example agent does: exit without the interpreter's final walk over every object
