"""A terminal ACP client for trying the GitHub example without an editor.

It spawns the agent over stdio (`service.testing.spawn_agent`), sends one prompt, shows you any link the agent asks
you to open (its message, the full URL, and its host with a warning for Punycode or mixed scripts) and opens it in
your browser only if you say yes. Then it prints what the agent answered.

    python -m examples.github_agent.try_it
"""

from __future__ import annotations

import asyncio
import os
import sys
import webbrowser

from acp import text_block

from service.testing import Elicitation, ScriptedClient, spawn_agent

PASSED_ON = ("CONNECTOR_", "GITHUB_AGENT_")  # the agent's configuration, taken from this environment


async def ask(elicitation: Elicitation) -> str:
    """Show the request and ask for consent; only then is the link opened."""
    host = elicitation.host
    print(f"\nThe agent asks: {elicitation.message}")
    print(f"  link: {elicitation.raw_params.get('url')}")
    if host is not None:
        warning = "  <- WARNING: Punycode or mixed-script host" if host.suspicious else ""
        print(f"  host: {host.unicode_host}{warning}")
    reply = await asyncio.to_thread(input, "Open it in your browser? [y/N] ")
    return "accept" if reply.strip().lower() in ("y", "yes") else "decline"


async def main() -> int:
    client = ScriptedClient(ask)
    env = {key: value for key, value in os.environ.items() if key.startswith(PASSED_ON)}
    async with spawn_agent(client, sys.executable, "-m", "examples.github_agent", env=env) as agent:
        await client.initialize(agent.conn)
        session = await agent.conn.new_session(cwd=os.getcwd())
        prompt = asyncio.create_task(
            agent.conn.prompt(session_id=session.session_id, prompt=[text_block("List my GitHub repositories")])
        )
        opener = asyncio.create_task(_open_consented(client))
        try:
            result = await prompt
        except Exception as exc:  # show whatever went wrong, then the agent's log
            print(f"\nThe prompt failed: {exc}\n--- agent stderr ---\n{agent.stderr()}", file=sys.stderr)
            return 1
        finally:
            opener.cancel()
    for _, update in client.updates:
        if getattr(update, "session_update", None) == "agent_message_chunk":
            print(f"\n{getattr(update.content, 'text', '')}")
    print(f"\n(stop reason: {result.stop_reason})")
    return 0


async def _open_consented(client: ScriptedClient) -> None:
    while True:
        elicitation = await client.next_consented(within=3600)
        print(f"Opening {elicitation.url} ... finish there; this waits until you are done.")
        webbrowser.open(elicitation.url)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
