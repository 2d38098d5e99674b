"""Rate limits on connect (GET and POST), callback and confirm, per client address and per elicitation:
429 with Retry-After and the code `rate_limited`, one `rate_limited` audit event per key and window, and the
client address from X-Forwarded-For only when the TCP peer is a trusted proxy."""

from __future__ import annotations

import secrets

import httpx
import pytest

from service import ElicitationStatus
from service.config import RateLimitSettings
from service.testing import ScriptedBrowser
from service.web.ratelimit import RateLimiter, TokenBuckets, route_group

from .conftest import Deployment
from .hardening_support import asking, audit_log_lines, status_of

LIMITS = {
    "CONNECT_PER_ADDRESS": "6",
    "CONNECT_PER_ELICITATION": "3",
    "CALLBACK_PER_ADDRESS": "4",
    "CALLBACK_PER_ELICITATION": "2",
    "CONFIRM_PER_ADDRESS": "2",
}


@pytest.fixture(params=["direct", "behind_proxy"])
def proxied(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "behind_proxy")


@pytest.fixture
def connector_env(connector_env: dict[str, str], proxied: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**connector_env, **{f"CONNECTOR_RATE_LIMIT__{k}": v for k, v in LIMITS.items()}}
    if proxied:
        env["CONNECTOR_SERVER__TRUSTED_PROXIES"] = "127.0.0.1/32"  # the test client's peer is the proxy
        env["CONNECTOR_IDENTITY__LOCAL__UNSAFE_ALLOW_REMOTE"] = "true"  # `local` refuses a proxy otherwise
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def assert_limited(answer: httpx.Response, *, max_wait: int) -> int:
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
    deployment: Deployment, caplog: pytest.LogCaptureFixture, proxied: bool
) -> None:
    caplog.set_level("INFO", logger="service.audit")
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        pages = [await browser.get(pending.url) for _ in range(3)]
        assert [p.status_code for p in pages] == [200, 200, 200]
        limited = await browser.get(pending.url)
        assert_limited(limited, max_wait=20)  # 3 per 60 s: one more every 20 s
        # The consent POST counts too: Continue is refused and nothing moves.
        posted = await browser.submit(pages[-1], "continue")
        assert_limited(posted, max_wait=20)
        assert await status_of(deployment, pending.elicitation_id) is ElicitationStatus.CONSENTED
        assert "location" not in posted.headers
        # Another elicitation from the same browser is not affected by this one's bucket.
        other = await ask()
        assert (await browser.get(other.url)).status_code == 200
    recorded = await deployment.connector.runtime.store.audit.list(event="rate_limited")
    assert len(recorded) == 1  # one audit row per key and window, however many refusals
    assert recorded[0].elicitation_id == pending.elicitation_id
    assert recorded[0].detail["route"] == "connect" and recorded[0].detail["limit"] == "elicitation"
    logged = [line for line in audit_log_lines(caplog) if line["event"] == "rate_limited"]
    assert len(logged) == 1 and logged[0]["elicitation_id"] == pending.elicitation_id


async def test_connect_is_limited_per_address(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        for _ in range(6):
            assert (await client.get(f"/connect/{secrets.token_urlsafe(24)}")).status_code == 404
        assert_limited(await client.get(f"/connect/{secrets.token_urlsafe(24)}"), max_wait=10)
        assert_limited(await client.post(f"/connect/{secrets.token_urlsafe(24)}", data={}), max_wait=10)
        # The health endpoints and static files are not limited.
        assert (await client.get("/healthz")).status_code == 200
    [detail] = await rate_limited_events(deployment)
    assert detail["route"] == "connect" and detail["limit"] == "address"
    assert detail["client_address"] == "127.0.0.1"


async def test_forwarded_address_counts_only_from_a_trusted_proxy(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:

        async def get(forwarded_for: str) -> httpx.Response:
            return await client.get(f"/connect/{secrets.token_urlsafe(24)}", headers={"X-Forwarded-For": forwarded_for})

        for _ in range(6):
            assert (await get("203.0.113.7")).status_code == 404
        assert_limited(await get("203.0.113.7"), max_wait=10)
        other = await get("198.51.100.9")  # another client behind the same proxy
        if proxied:
            assert other.status_code == 404  # its own bucket
        else:
            assert_limited(other, max_wait=10)  # untrusted peer: the header is ignored, the peer is the client
    details = await rate_limited_events(deployment)
    assert [d["client_address"] for d in details] == ["203.0.113.7" if proxied else "127.0.0.1"]


async def test_callback_is_limited_per_state_and_per_address(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        state = secrets.token_urlsafe(32)
        answers = [await client.get("/callback/github", params={"state": state, "code": "x"}) for _ in range(3)]
        assert [a.status_code for a in answers[:2]] == [400, 400]  # unknown state, refused normally
        assert_limited(answers[2], max_wait=30)  # 2 per 60 s for one state
        assert (await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)})).status_code == 400
        assert_limited(await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)}), max_wait=15)
    details = await rate_limited_events(deployment)
    assert [(d["route"], d["limit"]) for d in details] == [("callback", "elicitation"), ("callback", "address")]
    assert deployment.provider.token_requests == []


async def test_confirm_endpoint_is_limited_with_a_json_error(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        for _ in range(2):
            assert (await client.post("/v1/identity/confirm", json={})).status_code != 429
        limited = await client.post("/v1/identity/confirm", json={})
    assert_limited(limited, max_wait=30)
    assert limited.headers["content-type"] == "application/json"
    error = limited.json()["error"]
    assert error["code"] == "rate_limited" and "Too many requests" in error["message"]
    [detail] = await rate_limited_events(deployment)
    assert detail["route"] == "confirm"


# --- the pieces ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_refills_evenly_and_says_how_long_to_wait() -> None:
    clock = FakeClock()
    buckets = TokenBuckets(clock=clock)
    assert [buckets.take(("k",), 3, 60.0) for _ in range(3)] == [None, None, None]
    wait = buckets.take(("k",), 3, 60.0)
    assert wait == pytest.approx(20.0)
    clock.now += 19.0
    assert buckets.take(("k",), 3, 60.0) == pytest.approx(1.0)
    clock.now += 1.0
    assert buckets.take(("k",), 3, 60.0) is None
    assert buckets.take(("other",), 3, 60.0) is None  # keys are independent


def test_bucket_memory_is_bounded() -> None:
    clock = FakeClock()
    buckets = TokenBuckets(clock=clock, max_keys=100)
    for i in range(1000):
        buckets.take((str(i),), 5, 60.0)
    assert len(buckets) <= 100


def test_refusals_are_audited_once_per_key_and_window() -> None:
    clock = FakeClock()
    limiter = RateLimiter(RateLimitSettings(connect_per_elicitation=1, window_seconds=60), clock=clock)
    assert limiter.hit("connect", "elicitation", "e1") is None
    first = limiter.hit("connect", "elicitation", "e1")
    assert first is not None and first.retry_after == 60
    assert limiter.should_audit(first) is True
    assert limiter.should_audit(first) is False
    clock.now += 61
    assert limiter.should_audit(first) is True


def test_disabled_limits_never_refuse() -> None:
    limiter = RateLimiter(RateLimitSettings(enabled=False, connect_per_address=1))
    assert all(limiter.hit("connect", "address", "a") is None for _ in range(10))


@pytest.mark.parametrize(
    ("method", "path", "group"),
    [
        ("GET", "/connect/abc", "connect"),
        ("POST", "/connect/abc", "connect"),
        ("GET", "/connect", "connect"),
        ("GET", "/callback/github", "callback"),
        ("GET", "/identity/oidc/callback", "callback"),
        ("GET", "/identity/confirm/return", "callback"),
        ("GET", "/callback/github/extra", None),
        ("POST", "/v1/identity/confirm", "confirm"),
        ("GET", "/healthz", None),
        ("GET", "/static/style.css", None),
    ],
)
def test_route_groups(method: str, path: str, group: str | None) -> None:
    assert route_group(method, path) == group
