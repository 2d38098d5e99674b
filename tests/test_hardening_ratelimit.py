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
from service.web.ratelimit import RateLimiter, route_group

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
    deployment: Deployment, caplog: pytest.LogCaptureFixture, proxied: bool
) -> None:
    caplog.set_level("INFO", logger="service.audit")
    async with asking(deployment) as ask, ScriptedBrowser() as browser:
        pending = await ask()
        pages = [await browser.get(pending.url) for _ in range(3)]
        assert [p.status_code for p in pages] == [200, 200, 200]
        limited = await browser.get(pending.url)
        assert_limited(limited)  # 3 per 60 s: room again when the first of them leaves the window
        # The consent POST counts too: Continue is refused and nothing moves.
        posted = await browser.submit(pages[-1], "continue")
        assert_limited(posted)
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
        assert_limited(await client.get(f"/connect/{secrets.token_urlsafe(24)}"))
        assert_limited(await client.post(f"/connect/{secrets.token_urlsafe(24)}", data={}))
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
        assert_limited(await get("203.0.113.7"))
        other = await get("198.51.100.9")  # another client behind the same proxy
        if proxied:
            assert other.status_code == 404  # its own bucket
        else:
            assert_limited(other)  # untrusted peer: the header is ignored, the peer is the client
    details = await rate_limited_events(deployment)
    assert [d["client_address"] for d in details] == ["203.0.113.7" if proxied else "127.0.0.1"]


async def test_callback_is_limited_per_state_and_per_address(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        state = secrets.token_urlsafe(32)
        answers = [await client.get("/callback/github", params={"state": state, "code": "x"}) for _ in range(3)]
        assert [a.status_code for a in answers[:2]] == [400, 400]  # unknown state, refused normally
        assert_limited(answers[2])  # 2 per 60 s for one state
        assert (await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)})).status_code == 400
        assert_limited(await client.get("/callback/github", params={"state": secrets.token_urlsafe(32)}))
    details = await rate_limited_events(deployment)
    assert [(d["route"], d["limit"]) for d in details] == [("callback", "elicitation"), ("callback", "address")]
    assert deployment.provider.token_requests == []


async def test_confirm_endpoint_is_limited_with_a_json_error(deployment: Deployment, proxied: bool) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url) as client:
        for _ in range(2):
            assert (await client.post("/v1/identity/confirm", json={})).status_code != 429
        limited = await client.post("/v1/identity/confirm", json={})
    assert_limited(limited)
    assert limited.headers["content-type"] == "application/json"
    error = limited.json()["error"]
    assert error["code"] == "rate_limited" and "Too many requests" in error["message"]
    [detail] = await rate_limited_events(deployment)
    assert detail["route"] == "confirm"


# --- the pieces ---------------------------------------------------------------------------------------------


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
