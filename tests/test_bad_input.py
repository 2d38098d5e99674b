"""Bad input from a browser, on SQLite and PostgreSQL: a 4xx with a stable code before the store, never a 500, and
nothing changed (a NUL byte once made PostgreSQL answer 500); audit fields are bounded to their columns; bodies are
limited while they stream (413) and never spooled to disk. The `/v1` API's bad input is in test_api_bad_input.py."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service import ElicitationStatus, Identity, SessionScope
from service.store.audit import TRUNCATED
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect, eventually, status_is
from .conftest import Deploy, Deployment
from .flow_support import asking, status_of
from .raw_http_support import raw_exchange, row_counts, status_of_raw

LONG_PROVIDER = "p" * 80  # audit_events.provider is VARCHAR(64)


@pytest.fixture
async def deployment(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        yield deployment


async def consented(deployment: Deployment, elicitation_id: str) -> None:
    """Wait until the client's accept is stored: the status the refused requests must leave as it is."""
    await eventually(
        lambda: status_is(deployment.connector, elicitation_id, ElicitationStatus.CONSENTED), "the accept is stored"
    )


def assert_invalid(response: httpx.Response) -> None:
    assert response.status_code == 400, (response.request.url, response.status_code, response.text)
    assert response.headers["x-connector-error"] == "invalid_input"
    assert "Traceback" not in response.text
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


ODD_IDS = ["x", "%00", "a" * 5000, "..%2f..%2fetc%2fpasswd", "%F0%9F%98%80", "<script>", "' OR 1=1 --"]


@pytest.mark.parametrize("odd", ODD_IDS)
async def test_odd_input_never_causes_a_server_error(deployment: Deployment, odd: str) -> None:
    base = deployment.base_url
    requests = [
        ("GET", f"/connect/{odd}", None),
        ("GET", f"/connect?elicitationId={odd}", None),
        ("POST", f"/connect/{odd}", {"csrf": odd, "action": "continue"}),
        ("POST", f"/connect/{odd}", {"action": odd}),
        ("GET", f"/callback/github?state={odd}&code={odd}", None),
        ("GET", f"/callback/{odd}?state={odd}", None),
        ("GET", f"/callback/github?error={odd}&state={odd}", None),
        ("GET", "/callback/github", None),
        ("PUT", "/connect/abc", None),
        ("GET", f"/static/{odd}", None),
    ]
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for method, path, form in requests:
            # A refused callback answers at a clean address (303 to /callback/<provider>/failed/<ticket>).
            response = await client.request(method, path, data=form, follow_redirects=path.startswith("/callback/"))
            assert 400 <= response.status_code < 500, (method, path, response.status_code)
            if response.history:  # refused by the callback itself (malformed input is refused where it came)
                assert "/failed/" in response.url.path and not response.url.query, response.url
            assert "Traceback" not in response.text
            if "text/html" in response.headers.get("content-type", ""):
                assert response.headers.get("x-connector-error"), (method, path)
    assert await deployment.connector.runtime.store.grants.find(deployment.local_user, "github") == []


async def test_malformed_form_bodies_are_refused_cleanly(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url, timeout=10) as client:
        for body, content_type in [
            (b"\xff\xfe\x00garbage", "application/x-www-form-urlencoded"),
            (b"--x\r\nbroken", "multipart/form-data; boundary=x"),
            (b"{}", "application/json"),
        ]:
            response = await client.post("/connect/abc", content=body, headers={"content-type": content_type})
            assert 400 <= response.status_code < 500, (content_type, response.status_code)


async def test_nul_bytes_and_oversized_names_are_refused_before_the_store(deployment: Deployment) -> None:
    store = deployment.connector.runtime.store
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        await consented(deployment, pending.elicitation_id)
        page = await browser.get(pending.url)
        token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        before = await row_counts(store)
        client = browser.client
        base = deployment.base_url
        answers = [
            await client.get(f"{base}/connect/ab%00cd"),
            await client.get(f"{base}/connect", params={"elicitationId": "a\x00b"}),
            await client.post(f"{base}/connect/ab%00cd", data={"csrf": token, "action": "decline"}),
            await client.post(pending.url, data={"csrf": token + "\x00", "action": "decline"}),
            await client.post(pending.url, data={"csrf": token, "action": "decline\x00"}),
            await client.post(pending.url, data={"csrf": token, "action": "decline", "note": "a\x00b"}),
            await client.get(f"{base}/callback/{LONG_PROVIDER}", params={"state": "abc"}),
            await client.get(f"{base}/callback/git%00hub", params={"state": "abc"}),
            await client.get(f"{base}/callback/github", params={"state": "a\x00b"}),
            await client.get(f"{base}/callback/github", params={"state": "abc", "error": "x\r\ny"}),
            await client.get(f"{base}/connect/{pending.elicitation_id}", params={"x": "\x00"}),
            await client.get(f"{base}/connect/{'a' * 300}"),
            await client.get(f"{base}/static/%00.css"),
            await client.get(f"{base}/connect/%ff%fe"),
        ]
        for answer in answers:
            assert_invalid(answer)
        # Nothing was written by any of them, not even an audit row, and the elicitation did not move.
        assert await row_counts(store) == before
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CONSENTED


@pytest.mark.parametrize("account_id", ["1001\x00alice", "1001\nalice", "9" * 256])
async def test_a_provider_naming_an_account_id_the_grants_cannot_hold_is_refused(
    deployment: Deployment, account_id: str
) -> None:
    """A NUL once made PostgreSQL answer 500 and SQLite store a cut id; a longer one than the column, 500 on
    PostgreSQL. Refused as the provider's bad answer (502) before anything is stored."""
    store = deployment.connector.runtime.store
    deployment.provider.account = {**deployment.provider.account, "id": account_id}
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        await consented(deployment, pending.elicitation_id)
        before = await row_counts(store)
        final = await browser.authorize(pending.url)
        assert final.status_code == 502, final.text
        assert final.headers["x-connector-error"] == "provider_bad_response"
        assert "Traceback" not in final.text
        assert await status_of(deployment, pending.elicitation_id) == ElicitationStatus.FAILED
    after = await row_counts(store)
    assert after["grants"] == before["grants"] == 0


@pytest.mark.parametrize(
    ("user", "problem"),
    [
        (Identity("https://login.example.com", "mallory\x00alice"), "subject holds a NUL or an unpaired surrogate"),
        (Identity("https://login.example.com\ud800", "alice"), "issuer holds a NUL or an unpaired surrogate"),
        (Identity("https://login.example.com", "a" * 513), "subject is longer than 512 characters"),
    ],
)
async def test_an_agent_naming_a_user_the_store_cannot_hold_gets_a_clear_error(
    deployment: Deployment, user: Identity, problem: str
) -> None:
    """The embedded API (over a real ACP connection) refuses what the /v1 API refuses as invalid_input: a NUL once
    made PostgreSQL fail and SQLite's step triggers store a cut subject, another user's."""
    store = deployment.connector.runtime.store
    before = await row_counts(store)
    wire = await connect(deployment.connector, deployment.local_user, RecordingClient(answer="accept"))
    assert wire.agent.conn is not None
    with pytest.raises(ValueError, match=f"the user's identity cannot be stored: its {problem}"):
        await asyncio.wait_for(  # refused at once: it never gets as far as asking the client and waiting
            deployment.connector.request_authorization(
                wire.agent.conn, user=user, provider="github", scopes=["repo"], scope=SessionScope("sess-1")
            ),
            10,
        )
    assert await row_counts(store) == before


@pytest.mark.filterwarnings("ignore::service.core.audit_events.UnregisteredAuditEvent")  # made-up event names
async def test_audit_fields_are_bounded_to_their_columns(deployment: Deployment) -> None:
    audit = deployment.connector.runtime.store.audit
    await audit.record(
        "probe\x00" + "e" * 100,
        elicitation_id="id\x00" + "i" * 100,
        provider=LONG_PROVIDER + "\x00",
        detail={"callback_provider": "\r\n" + "d" * 2000},
    )
    [row] = await audit.list()
    assert len(row.event) == 64 and row.event.startswith("probe\\x00") and row.event.endswith(TRUNCATED)
    assert row.elicitation_id is not None and len(row.elicitation_id) == 64 and row.elicitation_id.startswith("id\\x00")
    assert row.provider is not None and len(row.provider) == 64 and row.provider.endswith(TRUNCATED)
    value = row.detail["callback_provider"]
    assert value.startswith("\\x0d\\x0a") and value.endswith(TRUNCATED) and len(value) == 512


async def test_a_forged_long_id_on_the_consent_form_is_audited_within_bounds(deployment: Deployment) -> None:
    forged = "A" * 64  # the longest well-formed id: refused for its CSRF token, recorded as given
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        answer = await client.post(f"/connect/{forged}", data={"csrf": "k1.abc", "action": "decline"})
    assert answer.status_code == 403 and answer.headers["x-connector-error"] == "csrf_failed"
    [row] = await deployment.connector.runtime.store.audit.list(event="csrf_failed")
    assert row.elicitation_id == forged


# --- bodies ------------------------------------------------------------------------------------------------


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where anything in this process would spool a body to disk."""
    directory = tmp_path / "spool"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def head(path: str, content_type: str, *, length: int | None = None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n").encode()


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_a_streamed_form_body_is_cut_off_at_its_limit(deployment: Deployment, spool_dir: Path) -> None:
    async with asking(deployment) as ask:
        pending = await ask()
        await consented(deployment, pending.elicitation_id)
        path = f"/connect/{pending.elicitation_id}"
        # 300 MB announced, sent in 64 KiB chunks: refused long before, the rest never read.
        answer, sent = await raw_exchange(
            deployment.base_url,
            head(path, "application/x-www-form-urlencoded"),
            chunk=chunked(b"a" * 65536),
            max_chunks=300 * 16,
        )
        assert status_of_raw(answer) == 413, answer[:200]
        assert b"x-connector-error: body_too_large" in answer.lower()
        assert sent < 100 * 2**20  # what the kernel's buffers took, not the whole upload
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CONSENTED
    assert os.listdir(spool_dir) == []


async def test_a_declared_oversized_body_is_refused_before_it_is_sent(deployment: Deployment) -> None:
    answer, sent = await raw_exchange(
        deployment.base_url, head("/connect/abc", "multipart/form-data; boundary=x", length=300 * 2**20)
    )
    assert status_of_raw(answer) == 413 and sent == 0


async def test_multipart_uploads_are_refused_and_never_spooled(deployment: Deployment, spool_dir: Path) -> None:
    async with asking(deployment) as ask:
        pending = await ask()
        part = b'--x\r\nContent-Disposition: form-data; name="f"; filename="f"\r\n\r\n' + b"a" * 65536
        answer, _ = await raw_exchange(
            deployment.base_url,
            head(f"/connect/{pending.elicitation_id}", "multipart/form-data; boundary=x"),
            chunk=chunked(part),
            max_chunks=48,  # 3 MB: more than python-multipart keeps in memory before it spools to a file
        )
        assert status_of_raw(answer) in (413, 415), answer[:200]
    assert os.listdir(spool_dir) == []


async def test_any_route_refuses_a_body_over_the_default_limit(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        answer = await client.request("GET", "/healthz", content=b"x" * (65 * 1024))
    assert answer.status_code == 413 and answer.headers["x-connector-error"] == "body_too_large"


def test_the_control_character_rule_is_unicodes_cc_and_cs_categories() -> None:
    """What every path, query, form field and JSON string is checked against: exactly the characters Unicode files
    under "Cc" (C0, DEL, C1) and "Cs" (surrogates), on every code point."""
    import sys
    import unicodedata

    from service.web.inputs import printable

    wrong = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if printable(chr(code)) == (unicodedata.category(chr(code)) in ("Cc", "Cs"))
    ]
    assert not wrong
    assert printable("a normal value, ünïcödé 中文 and all") and not printable("line\nbreak")
