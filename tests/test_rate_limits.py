"""Rate limits: 429 with Retry-After and the code `rate_limited` on connect (every method), callback and confirm,
per client address and per elicitation; one `rate_limited` audit row per key and window; a bounded number of audit
rows from requests that carry no credential; limits kept in Redis hold across replicas; the forwarded client address
is believed only from a trusted proxy (which the identity verifiers still see as the peer).

Two deployments: `per_route` (tight per-route limits, reached directly and behind a trusted proxy, on SQLite) and
`deployment` (connect and audit budgets behind a trusted proxy, on SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from service import ElicitationStatus
from service.config import RateLimitSettings
from service.rate_limiter import RateLimiter
from service.rate_limiter.moving_window import LocalMovingWindow
from service.testing import ScriptedBrowser
from service.web.ratelimit import route_group

from .conftest import ALICE, Deploy, Deployment, deploy
from .flow_support import asking, audit_log_lines, status_of

PER_ROUTE_LIMITS = {
    "CONNECTOR_RATE_LIMIT__CONNECT_PER_ADDRESS": "6",
    "CONNECTOR_RATE_LIMIT__CONNECT_PER_ELICITATION": "3",
    "CONNECTOR_RATE_LIMIT__CALLBACK_PER_ADDRESS": "4",
    "CONNECTOR_RATE_LIMIT__CALLBACK_PER_ELICITATION": "2",
    "CONNECTOR_RATE_LIMIT__CONFIRM_PER_ADDRESS": "2",
}
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
    "CONNECTOR_IDENTITY__LOCAL__UNSAFE_ALLOW_REMOTE": "true",  # `local` refuses a proxy otherwise
}


@pytest.fixture(params=["direct", "behind_proxy"])
def proxied(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "behind_proxy")


@pytest.fixture
async def per_route(deploy_with: Deploy, proxied: bool) -> AsyncIterator[Deployment]:
    """Tight per-route limits on SQLite, reached directly or through a trusted proxy."""
    async with deploy_with(**PER_ROUTE_LIMITS, **(BEHIND_PROXY if proxied else {})) as deployment:
        yield deployment


@pytest.fixture
async def deployment(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url, **LIMITS, **BEHIND_PROXY) as deployment:
        yield deployment


def assert_limited(answer: httpx.Response, *, max_wait: int = 60) -> int:
    assert answer.status_code == 429, answer.text
    assert answer.headers["x-connector-error"] == "rate_limited"
    retry_after = int(answer.headers["retry-after"])
    assert 1 <= retry_after <= max_wait
    assert answer.headers["cache-control"] == "no-store"  # security headers on the refusal too
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    return retry_after


async def rate_limited_events(deployment: Deployment) -> list[dict[str, object]]:
    return [e.detail for e in await deployment.connector.runtime.store.audit.list(event="rate_limited")]


async def test_connect_is_limited_per_elicitation(
    per_route: Deployment, caplog: pytest.LogCaptureFixture, proxied: bool
) -> None:
    caplog.set_level("INFO", logger="service.audit")
    async with asking(per_route) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        pages = [await browser.get(pending.url) for _ in range(3)]
        assert [p.status_code for p in pages] == [200, 200, 200]
        limited = await browser.get(pending.url)
        assert_limited(limited)  # 3 per 60 s: room again when the first of them leaves the window
        # The consent POST counts too: Continue is refused and nothing moves.
        posted = await browser.submit(pages[-1], "continue")
        assert_limited(posted)
        assert await status_of(per_route, pending.elicitation_id) is ElicitationStatus.CONSENTED
        assert "location" not in posted.headers
        # Another elicitation from the same browser is not affected by this one's bucket.
        other = await ask()
        assert (await browser.get(other.url)).status_code == 200
    recorded = await per_route.connector.runtime.store.audit.list(event="rate_limited")
    assert len(recorded) == 1  # one audit row per key and window, however many refusals
    assert recorded[0].elicitation_id == pending.elicitation_id
    assert recorded[0].detail["route"] == "connect" and recorded[0].detail["limit"] == "elicitation"
    logged = [line for line in audit_log_lines(caplog) if line["event"] == "rate_limited"]
    assert len(logged) == 1 and logged[0]["elicitation_id"] == pending.elicitation_id


async def test_connect_is_limited_per_address(per_route: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=per_route.base_url) as client:
        for _ in range(6):
            assert (await client.get(f"/connect/{secrets.token_urlsafe(24)}")).status_code == 404
        assert_limited(await client.get(f"/connect/{secrets.token_urlsafe(24)}"))
        assert_limited(await client.post(f"/connect/{secrets.token_urlsafe(24)}", data={}))
        # The health endpoints and static files are not limited.
        assert (await client.get("/healthz")).status_code == 200
    [detail] = await rate_limited_events(per_route)
    assert detail["route"] == "connect" and detail["limit"] == "address"
    assert detail["client_address"] == "127.0.0.1"


async def test_forwarded_address_counts_only_from_a_trusted_proxy(per_route: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=per_route.base_url) as client:

        async def get(forwarded_for: str) -> httpx.Response:
            return await client.get(f"/connect/{secrets.token_urlsafe(24)}", headers={"X-Forwarded-For": forwarded_for})

        for _ in range(6):
            assert (await get("203.0.113.7")).status_code == 404
        assert_limited(await get("203.0.113.7"))
        other = await get("198.51.100.9")  # another client behind the same proxy
        if proxied:
            assert other.status_code == 404  # its own bucket
        else:
            assert_limited(other)  # untrusted peer: the header is ignored, the peer is the client
    details = await rate_limited_events(per_route)
    assert [d["client_address"] for d in details] == ["203.0.113.7" if proxied else "127.0.0.1"]


async def test_callback_is_limited_per_state_and_per_address(per_route: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=per_route.base_url) as client:
        state = secrets.token_urlsafe(32)
        answers = [await client.get("/callback/github", params={"state": state, "code": "x"}) for _ in range(3)]
        refused = ("/callback/github/failed/", 303)  # unknown state, refused normally (at its clean page)
        assert [(a.headers.get("location", "")[:24], a.status_code) for a in answers[:2]] == [refused, refused]
        assert_limited(answers[2])  # 2 per 60 s for one state
        assert (await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)})).status_code == 303
        assert_limited(await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)}))
    details = await rate_limited_events(per_route)
    assert [(d["route"], d["limit"]) for d in details] == [("callback", "elicitation"), ("callback", "address")]
    assert per_route.provider.token_requests == []


async def test_confirm_endpoint_is_limited_with_a_json_error(per_route: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=per_route.base_url) as client:
        for _ in range(2):
            assert (await client.post("/v1/identity/confirm", json={})).status_code != 429
        limited = await client.post("/v1/identity/confirm", json={})
    assert_limited(limited)
    assert limited.headers["content-type"] == "application/json"
    error = limited.json()["error"]
    assert error["code"] == "rate_limited" and "Too many requests" in error["message"]
    [detail] = await rate_limited_events(per_route)
    assert detail["route"] == "confirm"


# --- the limiter and the route groups ---------------------------------------------------------------------------------


async def test_a_refusal_says_how_long_until_the_window_has_room() -> None:
    limiter = RateLimiter(RateLimitSettings(connect_per_elicitation=2, window_seconds=60))
    assert [await limiter.hit("connect", "elicitation", "e1") for _ in range(2)] == [None, None]
    refused = await limiter.hit("connect", "elicitation", "e1")
    assert refused is not None and 1 <= refused.retry_after <= 60
    assert await limiter.hit("connect", "elicitation", "e2") is None  # keys are independent
    assert await limiter.hit("callback", "elicitation", "e1") is None  # and so are groups


async def test_first_in_window_is_true_once_per_key() -> None:
    limiter = RateLimiter(RateLimitSettings(window_seconds=60))
    assert [await limiter.first_in_window("rate_limited", "k1") for _ in range(3)] == [True, False, False]
    assert await limiter.first_in_window("rate_limited", "k2") is True


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_local_window_counts_as_the_limits_library_does() -> None:
    """The same hits against limits' own moving window (its in-memory storage) and ours: the same answers."""
    item = RateLimitItemPerSecond(3, 60, namespace="connector")
    theirs = MovingWindowRateLimiter(MemoryStorage())
    ours = LocalMovingWindow()
    keys = [("connect", "elicitation", f"e{i % 4}") for i in range(40)]
    assert [await ours.hit(item, *k) for k in keys] == [await theirs.hit(item, *k) for k in keys]
    for key in set(keys):
        mine, library = await ours.get_window_stats(item, *key), await theirs.get_window_stats(item, *key)
        assert mine.remaining == library.remaining == 0
        assert abs(mine.reset_time - library.reset_time) < 1.0
    other = RateLimitItemPerSecond(5, 60, namespace="connector")  # another amount: a window of its own
    assert await ours.hit(other, "connect", "elicitation", "e0") is True


async def test_the_local_window_forgets_a_key_once_its_window_has_passed() -> None:
    clock = FakeClock()
    window = LocalMovingWindow(clock)
    item = RateLimitItemPerSecond(2, 60)
    assert [await window.hit(item, "k1") for _ in range(3)] == [True, True, False]
    clock.now += 30
    assert await window.hit(item, "k2") is True
    assert (await window.get_window_stats(item, "k1")).reset_time == clock.now + 30  # the oldest hit's window
    clock.now += 30  # k1's hits are out of the window (a hit exactly a window old still counts)
    assert await window.hit(item, "k1") is False and len(window) == 2
    clock.now += 0.001
    assert await window.hit(item, "k1") is True
    clock.now += 60.001  # both windows passed: the next hit drops both keys before counting its own
    assert await window.hit(item, "k3") is True and len(window) == 1
    stats = await window.get_window_stats(item, "k1")
    assert stats.remaining == 2 and stats.reset_time == clock.now + 60


async def test_the_local_window_empties_when_the_hits_stop() -> None:
    window = LocalMovingWindow()
    item = RateLimitItemPerSecond(1, 1)  # a one-second window
    assert [await window.hit(item, "k1"), await window.hit(item, "k2")] == [True, True]
    async with asyncio.timeout(10):  # no more hits: the sweep drops both keys once their window has passed
        while len(window):  # noqa: ASYNC110 - the count is the behaviour under test
            await asyncio.sleep(0.1)


async def test_disabled_limits_never_refuse() -> None:
    limiter = RateLimiter(RateLimitSettings(enabled=False, connect_per_address=1))
    assert [await limiter.hit("connect", "address", "a") for _ in range(10)] == [None] * 10


async def test_an_unreachable_storage_lets_requests_through(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RateLimiter(RateLimitSettings(storage_url="redis://127.0.0.1:9/0", connect_per_address=1))
    assert [await limiter.hit("connect", "address", "a") for _ in range(3)] == [None] * 3
    assert "rate limit storage failed" in caplog.text


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/connect/abc", "connect"),
        ("/connect", "connect"),
        ("/callback/github", "callback"),
        ("/identity/oidc/callback", "callback"),
        ("/identity/confirm/return", "callback"),
        ("/callback/github/extra", None),
        ("/v1/identity/confirm", "confirm"),
        ("/healthz", None),
        ("/static/style.css", None),
    ],
)
def test_route_groups(path: str, group: str | None) -> None:
    assert route_group(path) == group


# --- every method, the audit budget, forwarded addresses (SQLite and PostgreSQL) -------------------------------------


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
