"""The early-stop table: whatever stops a `request_authorization`, what the client receives, in order.

One row per (what stops it, where the elicitation is). Run against the connector's test agent over the in-memory
transport (`test_acp_cancellation.py`) and as a stdio subprocess (`test_acp_stdio_robustness.py`), with the SDK's
client (`ScriptedClient`, ACP v2 so foreground state is on the wire).

Stages: `create` (the client has not answered `elicitation/create`: it holds it), `browser` (the client accepted;
the user went to the provider and comes back only after the stop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from acp import text_block
from acp.client.connection import ClientSideConnection
from acp.exceptions import RequestError

from service import ElicitationStatus
from service.testing import ScriptedBrowser, ScriptedClient

AGENT_DEADLINE_SECONDS = 300.0  # the agent's own asyncio.timeout; the test runs it out (`_test/time_out`) on cue
TTL_SECONDS = 1
SWEEP_INTERVAL_SECONDS = 0.05  # the sweeper expires what is past its time; by default it looks every 5 s


@dataclass(frozen=True)
class Row:
    stop: str  # agent_timeout | task_cancel | session_cancel | client_cancel_request | ttl
    stage: str  # create | browser
    after: tuple[tuple[str, ...], ...]  # what the client receives after the elicitation/create, in order
    prompt: str  # how the prompt turn is answered: end_turn | cancelled | -32800
    status: ElicitationStatus

    @property
    def id(self) -> str:
        return f"{self.stop}-during-{self.stage}"

    @property
    def agent_deadline(self) -> float | None:
        return AGENT_DEADLINE_SECONDS if self.stop == "agent_timeout" else None

    @property
    def ttl(self) -> int | None:
        return TTL_SECONDS if self.stop == "ttl" else None

    @property
    def settings(self) -> dict[str, str]:
        """The connector's settings for this row (CONNECTOR_* variables): a short time to live for `ttl`."""
        if self.stop != "ttl":
            return {}
        return {
            "CONNECTOR_ELICITATION__TTL_SECONDS": str(TTL_SECONDS),
            "CONNECTOR_ELICITATION__SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL_SECONDS),
        }

    @property
    def user_finishes_late(self) -> bool:
        """The user is at the provider when the work stops, and comes back afterwards."""
        return self.stage == "browser" and self.stop != "ttl"


WITHDRAWN = ("cancel_request",)  # $/cancel_request naming our elicitation/create
RUNNING, IDLE = ("state", "running"), ("state", "idle")
CANCELLED, EXPIRED = ElicitationStatus.CANCELLED, ElicitationStatus.EXPIRED

TABLE = [
    Row("agent_timeout", "create", (WITHDRAWN, RUNNING), "end_turn", CANCELLED),
    Row("agent_timeout", "browser", (RUNNING,), "end_turn", CANCELLED),
    Row("task_cancel", "create", (WITHDRAWN, RUNNING), "end_turn", CANCELLED),
    Row("task_cancel", "browser", (RUNNING,), "end_turn", CANCELLED),
    Row("session_cancel", "create", (WITHDRAWN, IDLE), "cancelled", CANCELLED),
    Row("session_cancel", "browser", (IDLE,), "cancelled", CANCELLED),
    Row("client_cancel_request", "create", (WITHDRAWN, IDLE), "-32800", CANCELLED),
    Row("client_cancel_request", "browser", (IDLE,), "-32800", CANCELLED),
    Row("ttl", "create", (WITHDRAWN, RUNNING), "end_turn", EXPIRED),
    Row("ttl", "browser", (RUNNING,), "end_turn", EXPIRED),
]


def client_for(row: Row) -> ScriptedClient:
    return ScriptedClient("hold" if row.stage == "create" else "accept", protocol_version=2)


def wire_events(client: ScriptedClient) -> list[tuple[Any, ...]]:
    """What the client received that the table speaks about, in order."""
    events: list[tuple[Any, ...]] = []
    for wire in client.transcript:
        message = wire.message
        if wire.direction != "in":
            continue
        method = message.get("method")
        params = message.get("params") or {}
        if method == "elicitation/create":
            events.append(("create", message["id"]))
        elif method == "$/cancel_request":
            events.append(("cancel_request", params.get("requestId")))
        elif method == "elicitation/complete":
            events.append(("complete", params.get("elicitationId")))
        elif method == "session/update" and params.get("update", {}).get("sessionUpdate") == "state_update":
            events.append(("state", params["update"].get("state")))
    return events


async def run_row(
    row: Row,
    client: ScriptedClient,
    conn: ClientSideConnection,
    session_id: str,
    status_of: Callable[[str], Awaitable[ElicitationStatus | None]],
) -> None:
    """Drive one row and check what the client received, how the turn ended, and how the elicitation ended."""
    prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[text_block("go")]))
    async with ScriptedBrowser() as browser:
        to_provider = None
        if row.stage == "create":
            elicitation = await client.next_elicitation(within=30)
        else:
            elicitation = await client.next_consented(within=30)
            if row.user_finishes_late:
                page = await browser.get(elicitation.url)
                to_provider = await browser.submit(page, "continue")

        if row.stop == "agent_timeout":
            await conn.ext_notification("test/time_out", {"sessionId": session_id})
        elif row.stop == "task_cancel":
            await conn.ext_notification("test/cancel_authorization", {"sessionId": session_id})
        elif row.stop == "session_cancel":
            await conn.cancel(session_id=session_id)
        elif row.stop == "client_cancel_request":
            prompt_id = client.sent("session/prompt")[-1]["id"]
            await client.cancel_request(prompt_id)
        # ttl: the time runs out by itself

        try:
            answered = (await asyncio.wait_for(prompt, 30)).stop_reason
        except RequestError as exc:
            answered = str(exc.code)
        assert answered == row.prompt, (row.id, answered)

        if to_provider is not None:
            final = await browser.follow(to_provider)
            assert final.status_code == 200  # the user did authorize: the grant is stored ...
    await conn.new_session(cwd="/")  # a round trip: anything sent before its answer has arrived

    create_id = elicitation.request_id
    expected = [("state", "requires_action"), ("create", create_id)]
    expected += [(*event, create_id) if event == WITHDRAWN else event for event in row.after]
    assert wire_events(client) == expected, row.id  # ... but no elicitation/complete: nothing resumes
    assert await status_of(elicitation.elicitation_id or "") is row.status
    assert client.violations == []
