"""Real deliveries checked by the Standard Webhooks specification's reference libraries, not by the connector's
code: Python `standardwebhooks` (PyPI) and JavaScript `standardwebhooks` (npm, tests/js_receivers), before, during
and after a secret rotation. During the overlap a receiver that knows only the old secret and one that knows only
the new one both verify every delivery; after it only the new one does. Elicitation and grant events alike, each in
the specification's envelope (`type`, `timestamp`, `data`)."""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import standardwebhooks

from service.testing import ScriptedBrowser

from .api_support import api_client, create_body, make_key
from .conftest import Deploy
from .js_receivers_support import node_command
from .test_api_webhooks import FAST, Received, end_one_elicitation, receiving


@dataclass
class Case:
    """One delivery, a secret, and whether the reference libraries must accept it."""

    phase: str
    secret: str
    received: Received
    verifies: bool


def python_verifies(secret: str, received: Received) -> Any:
    """The parsed body, or None when the Python reference library refuses the delivery."""
    try:
        return standardwebhooks.Webhook(secret).verify(received.body, received.headers)
    except standardwebhooks.webhooks.WebhookVerificationError:
        return None


def javascript_answers(cases: list[Case]) -> list[dict[str, Any]]:
    """What the JavaScript reference library answers for each case (one node process for all)."""
    given = [
        {"secret": c.secret, "headers": c.received.headers, "body": base64.b64encode(c.received.body).decode()}
        for c in cases
    ]
    done = subprocess.run(
        node_command("verify_webhooks.mjs"), input=json.dumps(given), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


async def test_reference_libraries_verify_deliveries_before_during_and_after_a_secret_rotation(
    deploy_with: Deploy, database_url: str
) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **FAST) as deployment, receiving() as receiver:
        store = deployment.connector.runtime.store
        user = deployment.local_user
        key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, key) as api:
            made = (await api.post("/v1/webhooks", json={"url": receiver.url})).json()
            webhook_id, old = made["webhookId"], made["secret"]

            # Before: a real authorization ends in elicitation.completed.
            body = (await api.post("/v1/elicitations", json=create_body(user))).json()
            async with ScriptedBrowser() as browser:
                assert (await browser.authorize(body["url"])).status_code == 200
            await receiver.wait_until(lambda r: len(r.requests) >= 1)
            before = receiver.requests[0]

            # During the overlap: a revoked grant and a cancelled elicitation.
            rotated = await api.post(f"/v1/webhooks/{webhook_id}/secret", json={"overlapSeconds": 60})
            new = rotated.json()["secret"]
            (grant,) = (await api.get("/v1/grants", params={"issuer": user.issuer, "subject": user.subject})).json()[
                "grants"
            ]
            assert (await api.delete(f"/v1/grants/{grant['grantId']}")).status_code == 204
            await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 3)
            # Sent concurrently: in the log's order by their ids.
            during = sorted(receiver.requests[1:3], key=lambda r: int(r.headers["webhook-id"]))

            # After the overlap (the connector's clock moved on): only the new secret signs.
            deployment.connector.clock.advance(timedelta(seconds=61))
            await end_one_elicitation(api)
            await receiver.wait_until(lambda r: len(r.requests) >= 4)
            after = receiver.requests[3]

    assert len(receiver.requests) == 4
    types = [json.loads(r.body)["type"] for r in (before, *during, after)]
    assert types == ["elicitation.completed", "grant.revoked", "elicitation.cancelled", "elicitation.cancelled"]
    cases = [Case("before", old, before, True)]
    cases += [Case("during", secret, each, True) for each in during for secret in (old, new)]
    cases += [Case("after", new, after, True), Case("after", old, after, False)]

    for case in cases:
        envelope = python_verifies(case.secret, case.received)
        if not case.verifies:
            assert envelope is None, case.phase
            continue
        assert envelope is not None, (case.phase, case.received.headers)
        assert set(envelope) == {"type", "timestamp", "data"}
        assert datetime.fromisoformat(envelope["timestamp"]).tzinfo is not None
        assert envelope["data"]["id"] == int(case.received.headers["webhook-id"])
    revoked = json.loads(during[0].body)["data"]
    assert (revoked["type"], revoked["grantId"], revoked["provider"]) == ("grant.revoked", grant["grantId"], "github")

    for case, answer in zip(cases, javascript_answers(cases), strict=True):
        if case.verifies:
            assert answer == {"ok": json.loads(case.received.body)}, (case.phase, answer)
        else:
            assert "error" in answer and "WebhookVerificationError" in answer["error"], (case.phase, answer)
    # Each delivery during the overlap carries two space-separated `v1,<base64>` signatures; the others one.
    for received, count in [(before, 1), *((each, 2) for each in during), (after, 1)]:
        signatures = received.headers["webhook-signature"].split(" ")
        assert len(signatures) == count and all(s.startswith("v1,") for s in signatures)
        assert all(len(base64.b64decode(s[3:], validate=True)) == 32 for s in signatures)
