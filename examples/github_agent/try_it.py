"""A terminal ACP client for trying the GitHub example without an editor.

It spawns the agent over stdio (`service.testing.spawn_agent`), sends one prompt, shows you any link the agent asks
you to open (its message, the full URL, and its host with a warning for Punycode or mixed scripts) and opens it in
your browser only if you say yes. Then it prints what the agent answered. The agent's log (its stderr) is shown as
it runs, so a problem reads as an error, not as a wait.

    python -m examples.github_agent.try_it            # GitHub: CONNECTOR_PROVIDER_GITHUB_CLIENT_ID / _SECRET
    python -m examples.github_agent.try_it --demo     # a mock GitHub on loopback: nothing leaves this machine
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import webbrowser
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from acp import text_block

from service.testing import Elicitation, MockOAuthProvider, ScriptedClient, spawn_agent

PASSED_ON = ("CONNECTOR_", "GITHUB_AGENT_")  # the agent's configuration, taken from this environment
DEMO_REPOS = [
    {"id": 1, "full_name": "demo-user/hello-world", "private": False},
    {"id": 2, "full_name": "demo-user/connector-demo", "private": True},
]


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


def show_agent_log(line: str) -> None:
    print(f"  agent | {line}", file=sys.stderr, flush=True)


@asynccontextmanager
async def demo_provider() -> AsyncIterator[dict[str, str]]:
    """A mock GitHub on a loopback port while the block runs; yields the environment that points the agent at it."""
    provider = MockOAuthProvider(
        client_id="demo-client", account={"id": 7, "login": "demo-user", "name": "Demo User"}, repos=DEMO_REPOS
    )
    async with provider.serve_http():
        with tempfile.TemporaryDirectory(prefix="github-agent-demo-") as directory:
            catalog = Path(directory) / "providers.toml"
            entry = {**provider.catalog_entry(), "display_name": "GitHub (demo)"}
            catalog.write_text("[github]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items()))
            print(f"Demo: a mock GitHub serves on {provider.base_url} (nothing leaves this machine).")
            yield {
                "CONNECTOR_PROVIDERS__CATALOG": str(catalog),
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_ID": provider.client_id,
                "CONNECTOR_PROVIDER_GITHUB_CLIENT_SECRET": provider.client_secret,
            }


async def main(demo: bool) -> int:
    env = {key: value for key, value in os.environ.items() if key.startswith(PASSED_ON)}
    if not demo:
        return await run_agent(env)
    async with demo_provider() as demo_env:
        return await run_agent({**env, **demo_env})


async def run_agent(
    env: dict[str, str], command: tuple[str, ...] = (sys.executable, "-m", "examples.github_agent")
) -> int:
    """Spawn the agent (`command`, this example's by default) with `env`, send one prompt, print its answer."""
    client = ScriptedClient(ask)
    async with spawn_agent(client, *command, env=env, on_stderr=show_agent_log) as agent:
        try:
            await client.initialize(agent.conn)
            session = await agent.conn.new_session(cwd=os.getcwd())
            prompt = asyncio.create_task(
                agent.conn.prompt(session_id=session.session_id, prompt=[text_block("List my GitHub repositories")])
            )
            opener = asyncio.create_task(_open_consented(client))
            try:
                result = await prompt
            finally:
                opener.cancel()
        except Exception as exc:  # the agent's own words (its log above) say why
            code = agent.process.returncode
            ended = f" (the agent exited with {code})" if code is not None else ""
            print(f"\nThe agent did not answer: {exc or type(exc).__name__}{ended}", file=sys.stderr)
            return 1
    for _, update in client.updates:
        if getattr(update, "session_update", None) == "agent_message_chunk":
            print(f"\n{getattr(update.content, 'text', '')}")
    print(f"\n(stop reason: {result.stop_reason})")
    return 0


async def _open_consented(client: ScriptedClient) -> None:
    while True:
        elicitation = await client.next_consented(within=3600)
        print(f"Opening {elicitation.url} ... finish there; this waits until you are done.", flush=True)
        webbrowser.open(elicitation.url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", action="store_true", help="use a mock GitHub on loopback instead of github.com")
    sys.exit(asyncio.run(main(parser.parse_args().demo)))
