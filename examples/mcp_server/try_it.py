"""A terminal MCP client (the official SDK's) for trying the example server against a running connector.

It starts the example over stdio (or connects to it over streamable HTTP with `--http URL`, the bearer in
`MCP_BEARER`), calls one tool, shows any link the server asks you to open and opens it in your browser only if you
say yes, and prints the tool's answer. With `--after-retry` it calls `list_repositories_after_retry`: the server
answers -32042, you open the link, and once `notifications/elicitation/complete` arrives the call is made again.

    python -m examples.mcp_server.try_it [--protocol 2025-11-25|2026-07-28] [--after-retry] [--http URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import webbrowser
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


async def consent(message: str, url: str) -> bool:
    print(f"\nThe server asks: {message}\n  link: {url}")
    reply = await asyncio.to_thread(input, "Open it in your browser? [y/N] ")
    if reply.strip().lower() not in ("y", "yes"):
        return False
    webbrowser.open(url)
    return True


async def on_elicitation(ctx: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    if not isinstance(params, types.ElicitRequestURLParams):
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept" if await consent(params.message, params.url) else "decline")


def transport(args: argparse.Namespace) -> Any:
    if args.http:
        headers = {"Authorization": f"Bearer {os.environ['MCP_BEARER']}"} if os.environ.get("MCP_BEARER") else {}
        return streamable_http_client(args.http, http_client=httpx2.AsyncClient(headers=headers, timeout=300))
    command = [sys.executable, "-m", "examples.mcp_server", "stdio"]
    return stdio_client(StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ)))


async def main(args: argparse.Namespace) -> None:
    completed = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            print(f"(the server says elicitation {message.params.elicitation_id} is complete)")
            completed.set()

    mode = "legacy" if args.protocol == "2025-11-25" else args.protocol
    async with Client(
        transport(args), elicitation_callback=on_elicitation, message_handler=on_message, mode=mode
    ) as client:
        print(f"connected, protocol {client.protocol_version}")
        tool = "list_repositories_after_retry" if args.after_retry else "list_repositories"
        try:
            result = await client.call_tool(tool, {})
        except MCPError as error:
            if error.error.code != types.URL_ELICITATION_REQUIRED:
                raise
            (needed,) = (error.error.data or {}).get("elicitations", [])
            if not await consent(needed["message"], needed["url"]):
                return
            print("waiting for the browser ...")
            await completed.wait()
            result = await client.call_tool(tool, {})
        for block in result.content:
            if isinstance(block, types.TextContent):
                print(block.text)


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--protocol", choices=["2025-11-25", "2026-07-28"], default="2025-11-25")
    parser.add_argument("--after-retry", action="store_true", help="the -32042 tool")
    parser.add_argument("--http", metavar="URL", help="the example over streamable HTTP at URL (bearer: MCP_BEARER)")
    asyncio.run(main(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(run())
