"""The audit trail: every event of an elicitation's life is a row in `audit_events` and one structured log line
on `service.audit` with the same fields, never holding a secret; events of a rolled-back transaction are
neither stored nor logged."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from service.testing import ScriptedBrowser

from .conftest import BOB, Deployment
from .flow_support import asking, audit_log_lines, to_callback, with_query


async def assert_table_and_log_agree(
    deployment: Deployment, caplog: pytest.LogCaptureFixture, elicitation_id: str
) -> list[str]:
    rows = await deployment.connector.runtime.store.audit.list(elicitation_id=elicitation_id)
    lines = [line for line in audit_log_lines(caplog) if line["elicitation_id"] == elicitation_id]
    assert [(r.event, r.provider, r.detail) for r in rows] == [
        (line["event"], line["provider"], line["detail"]) for line in lines
    ]
    return [r.event for r in rows]


def assert_no_secret_logged(deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    audit_records = [r for r in caplog.records if r.name == "service.audit"]
    text = "\n".join(r.getMessage() + json.dumps(r.__dict__, default=str) for r in audit_records)
    for secret in deployment.provider.secrets_issued():
        assert secret not in text


@pytest.fixture(autouse=True)
def audit_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="service.audit")
    return caplog


async def test_a_completed_flow_is_audited_and_logged(deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        final = await browser.authorize(pending.url)
        assert final.status_code == 200
        assert (await pending.outcome()).ok
    recorded = await assert_table_and_log_agree(deployment, caplog, pending.elicitation_id)
    for event in ("created", "consented", "opened", "verified", "completed", "completion_sent"):
        assert event in recorded
    assert_no_secret_logged(deployment, caplog)


@pytest.mark.parametrize(
    "scenario",
    ["declined", "declined_in_client", "cancelled", "expired", "provider_error", "replay_attempt", "identity_mismatch"],
)
async def test_each_ending_and_attack_is_audited_and_logged(
    deployment: Deployment, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, scenario: str
) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        if scenario == "declined":
            pending = await ask()
            await browser.submit(await browser.get(pending.url), "decline")
            expected = "declined"
        elif scenario == "declined_in_client":
            pending = await ask(answer="decline")
            await pending.outcome()
            expected = "declined"
        elif scenario == "cancelled":
            pending = await ask(answer="cancel")
            await pending.outcome()
            expected = "cancelled"
        elif scenario == "expired":
            pending = await ask()
            ttl = deployment.connector.settings.elicitation.ttl_seconds
            deployment.connector.clock.advance(timedelta(seconds=ttl + 1))
            assert (await browser.get(pending.url)).status_code == 410
            expected = "expired"
        elif scenario == "provider_error":
            pending = await ask()
            callback = await to_callback(browser, pending.url)
            await browser.get(with_query(callback, code=None, error="server_error"))
            expected = "provider_error"
        elif scenario == "replay_attempt":
            pending = await ask()
            callback = await to_callback(browser, pending.url)
            assert (await browser.get(callback)).status_code == 303  # to the done page
            replayed = await browser.get(callback)
            assert replayed.status_code == 303 and replayed.headers["location"].startswith("/callback/github/failed/")
            assert (await browser.follow(replayed)).status_code == 400
            expected = "replay_attempt"
        else:  # the agent bound the elicitation to Bob; the browser's verified user is the local user (Alice)
            pending = await ask(user=BOB)
            page = await browser.get(pending.url)
            refused = await browser.submit(page, "continue")
            assert refused.status_code == 403 and refused.headers["x-connector-error"] == "identity_mismatch"
            expected = "identity_mismatch"
        recorded = await assert_table_and_log_agree(deployment, caplog, pending.elicitation_id)
    assert "created" in recorded and expected in recorded
    assert_no_secret_logged(deployment, caplog)


async def test_log_lines_carry_structured_fields(deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    from service.logs import formatter

    async with asking(deployment) as ask:
        pending = await ask(answer="decline")
        await pending.outcome()
    record = next(r for r in caplog.records if r.name == "service.audit" and r.__dict__["audit_event"] == "declined")
    line = json.loads(formatter("json").format(record))
    assert line["logger"] == "service.audit"
    assert line["audit_event"] == "declined"
    assert line["elicitation_id"] == pending.elicitation_id
    assert line["provider"] == "github"
    assert line["identity_subject"] == deployment.local_user.subject
    assert line["detail"]["reason"] == "declined in the client"


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_rolled_back_events_are_neither_stored_nor_logged(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    store = deployment.connector.runtime.store

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with store.transaction() as conn:
            await store.audit.record("probe_rolled_back", conn=conn)
            raise Boom
    async with store.transaction() as conn:
        await store.audit.record("probe_committed", conn=conn)
        assert not any(line["event"] == "probe_committed" for line in audit_log_lines(caplog))  # not before commit
    logged = [line["event"] for line in audit_log_lines(caplog)]
    assert "probe_rolled_back" not in logged and logged.count("probe_committed") == 1
    stored = [e.event for e in await store.audit.list()]
    assert "probe_rolled_back" not in stored and "probe_committed" in stored
    # The pooled connection does not carry the pending list into its next use.
    await store.audit.record("probe_after")
    assert [line["event"] for line in audit_log_lines(caplog)].count("probe_after") == 1


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_secret_named_detail_is_redacted_in_table_and_log(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    store = deployment.connector.runtime.store
    await store.audit.record("probe", detail={"access_token": "tok-123", "code": "c-456", "reason": "kept"})
    [row] = await store.audit.list(event="probe")
    assert row.detail == {"access_token": "[redacted]", "code": "[redacted]", "reason": "kept"}
    [line] = [line for line in audit_log_lines(caplog) if line["event"] == "probe"]
    assert line["detail"] == row.detail
    assert "tok-123" not in caplog.text and "c-456" not in caplog.text
