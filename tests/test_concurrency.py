"""Many flows at once on SQLite: no request fails, and each client gets exactly one `elicitation/complete`.

All 200 elicitations are open (and their agents waiting) at once; the browsers run 25 at a time, because they
share the test's one event loop (and CPU) with the server, the agents and the clients.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest

from service import AuthorizationStatus, ElicitationStatus
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, Wire, connect, prompt_text
from .conftest import Deploy

FLOWS = 200
BROWSERS_AT_ONCE = 25


@pytest.mark.duration(9)
async def test_200_concurrent_flows_on_sqlite_complete_once_each_without_errors(deploy_with: Deploy) -> None:
    async with deploy_with(CONNECTOR_RATE_LIMIT__ENABLED="false") as deployment:
        connector = deployment.connector
        assert connector.settings.database.url.startswith("sqlite")
        wires = [
            await connect(connector, deployment.local_user, RecordingClient(answer="accept")) for _ in range(FLOWS)
        ]
        prompts = [
            asyncio.create_task(w.client_conn.prompt(session_id="sess-1", prompt=prompt_text("repos"))) for w in wires
        ]
        # Every elicitation exists before any browser finishes (else later prompts would find the new grant).
        urls = await asyncio.gather(*(w.client.next_url() for w in wires))

        tls = ssl.create_default_context()  # one for all browsers: building one per client costs ~20 ms of CPU
        at_once = asyncio.Semaphore(BROWSERS_AT_ONCE)

        async def browse(url: str) -> list[int]:
            async with at_once, ScriptedBrowser(verify=tls) as browser:
                final = await browser.authorize(url)
                assert final.status_code == 200, final.text
                return [r.status_code for r in browser.responses]

        statuses = await asyncio.gather(*(browse(url) for url in urls))
        results = await asyncio.wait_for(asyncio.gather(*prompts), 120)

        assert all(code < 400 for codes in statuses for code in codes)
        assert {r.stop_reason for r in results} == {"end_turn"}
        assert all([o.status for o in w.agent.outcomes] == [AuthorizationStatus.AUTHORIZED] for w in wires)
        for wire in wires:
            elicitation_id = _elicitation_id(wire)
            assert wire.client.completions == [elicitation_id]
            assert [m["params"] for m in wire.received("elicitation/complete")] == [{"elicitationId": elicitation_id}]
            record = await connector.elicitation(elicitation_id)
            assert record is not None and record.status is ElicitationStatus.COMPLETED
        sent = await connector.runtime.store.audit.list(event="completion_sent")
        assert sorted(e.elicitation_id or "" for e in sent) == sorted(_elicitation_id(w) for w in wires)
        for wire in wires:
            await wire.close()


def _elicitation_id(wire: Wire) -> str:
    creates = wire.received("elicitation/create")
    assert len(creates) == 1
    return str(creates[0]["params"]["elicitationId"])
