"""Finding 5 of the security review, on SQLite and PostgreSQL: every method counts against the rate limits (HEAD
once slipped past them), and requests carrying no credential at all write a bounded number of audit rows. Also:
limits kept in Redis hold across replicas, and the forwarded client address is believed only from trusted proxies
(uvicorn's ProxyHeadersMiddleware, with the TCP peer kept for the identity verifiers)."""

from __future__ import annotations

import random
import secrets
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from service.testing import ScriptedBrowser

from .conftest import ALICE, Deploy, Deployment, deploy
from .hardening_support import asking

LIMITS = {
    "CONNECTOR_RATE_LIMIT__CONNECT_PER_ADDRESS": "5",
    "CONNECTOR_RATE_LIMIT__CONNECT_PER_ELICITATION": "3",
    "CONNECTOR_RATE_LIMIT__CALLBACK_PER_ADDRESS": "1000",
    "CONNECTOR_RATE_LIMIT__CALLBACK_PER_ELICITATION": "1000",
    "CONNECTOR_RATE_LIMIT__AUDIT_PER_ADDRESS": "3",
    "CONNECTOR_RATE_LIMIT__AUDIT_TOTAL": "8",
}
BEHIND_PROXY = {
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",  # the test's loopback peer plays the proxy
    "CONNECTOR_IDENTITY__LOCAL__UNSAFE_ALLOW_REMOTE": "true",
}


@pytest.fixture
async def deployment(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **LIMITS, **BEHIND_PROXY) as deployment:
        yield deployment


def a_client() -> str:
    """A documentation address (TEST-NET-3), different in every run so that Redis keys never meet."""
    return f"203.0.113.{random.randrange(1, 255)}"


async def test_every_method_counts_against_the_connect_limits(deployment: Deployment) -> None:
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        # HEAD and OPTIONS take from the same window as GET and POST, per elicitation ...
        for method in ("HEAD", "OPTIONS", "HEAD"):
            answer = await browser.client.request(method, pending.url)
            assert answer.status_code != 429, method
        assert (await browser.get(pending.url)).status_code == 429
        # ... and per address.
        answers = [await browser.client.head(f"{deployment.base_url}/connect/{secrets.token_urlsafe(24)}")]
        answers.append(await browser.client.get(f"{deployment.base_url}/connect/{secrets.token_urlsafe(24)}"))
    assert [a.status_code for a in answers] == [404, 429]
    assert answers[1].headers["x-connector-error"] == "rate_limited"


async def test_requests_without_credentials_write_a_bounded_number_of_audit_rows(deployment: Deployment) -> None:
    audit = deployment.connector.runtime.store.audit
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        first, second = a_client(), a_client()
        for _ in range(20):  # an unknown state each time, from one client
            await client.get(
                "/callback/github", params={"state": secrets.token_urlsafe(16)}, headers={"X-Forwarded-For": first}
            )
        rows = await audit.list()
        assert [r.event for r in rows] == ["unknown_state"] * 3 + ["audit_suppressed"]
        assert rows[-1].detail["client_address"] == first and rows[-1].detail["first_suppressed"] == "unknown_state"
        # Forged consent forms from another client: its own budget ...
        for _ in range(20):
            await client.post(
                f"/connect/{secrets.token_urlsafe(24)}",
                data={"csrf": "k1.forged", "action": "continue"},
                headers={"X-Forwarded-For": second},
            )
        # ... and many clients together stop at the total (8 per window).
        for _ in range(20):
            await client.get(
                "/callback/github", params={"state": secrets.token_urlsafe(16)}, headers={"X-Forwarded-For": a_client()}
            )
    events = [r.event for r in await audit.list()]
    assert events.count("csrf_failed") == 3
    assert events.count("unknown_state") + events.count("csrf_failed") == 8
    assert events.count("audit_suppressed") == 3  # one per client that ran out, and one for everyone
    assert events.count("rate_limited") == 1  # the second client also ran into the connect limit (5), once
    assert len(events) == 12


async def test_a_malformed_forwarded_address_is_not_believed(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        for _ in range(5):
            await client.get(f"/connect/{secrets.token_urlsafe(24)}", headers={"X-Forwarded-For": "not-an-address"})
        # Each junk value would otherwise be a fresh client: the proxy's own address is counted instead.
        limited = await client.get(f"/connect/{secrets.token_urlsafe(24)}", headers={"X-Forwarded-For": "junk-2"})
    assert limited.status_code == 429
    [row] = await deployment.connector.runtime.store.audit.list(event="rate_limited")
    assert row.detail["client_address"] == "127.0.0.1"


# --- across replicas ---------------------------------------------------------------------------------------


@pytest.fixture
def second_socket() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.mark.redis
async def test_limits_kept_in_redis_hold_across_replicas(
    deploy_with: Deploy,
    connector_env: dict[str, str],
    tmp_path: object,
    second_socket: socket.socket,
    redis_url: str,
) -> None:
    shared = {**LIMITS, **BEHIND_PROXY, "CONNECTOR_RATE_LIMIT__STORAGE_URL": redis_url}
    async with deploy_with(**shared) as a:
        b_env = {**connector_env, "CONNECTOR_PUBLIC_BASE_URL": f"http://127.0.0.1:{second_socket.getsockname()[1]}"}
        async with deploy(b_env, tmp_path, a.provider, second_socket, None, **shared) as b:  # type: ignore[arg-type]
            client_address = a_client()
            headers = {"X-Forwarded-For": client_address}
            async with httpx.AsyncClient(headers=headers) as client:
                for replica in (a, b, a, b, a):
                    answer = await client.get(f"{replica.base_url}/connect/{secrets.token_urlsafe(24)}")
                    assert answer.status_code == 404
                # Five in the window, spread over both: the sixth is refused by either.
                assert (await client.get(f"{b.base_url}/connect/{secrets.token_urlsafe(24)}")).status_code == 429
                assert (await client.get(f"{a.base_url}/connect/{secrets.token_urlsafe(24)}")).status_code == 429


# --- the identity verifiers still see the proxy ------------------------------------------------------------


async def test_a_trusted_proxy_that_forwards_the_client_address_is_still_the_trusted_peer(
    deploy_with: Deploy, database_url: str
) -> None:
    proxy = {
        "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
        "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": ALICE.issuer,
        "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",
    }
    async with deploy_with(ALICE, CONNECTOR_DATABASE__URL=database_url, **proxy) as deployment:
        async with asking(deployment) as ask:
            pending = await ask(user=ALICE)
            headers = {"X-Forwarded-User": "alice", "X-Forwarded-For": a_client()}
            async with ScriptedBrowser(headers=headers) as alice:
                final = await alice.authorize(pending.url)
    assert final.status_code == 200, final.text
