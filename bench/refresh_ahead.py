"""Refreshing ahead (`[grants] proactive_refresh`): how long an agent's calls wait when tokens expire under them.

The mock provider (over loopback) issues access tokens that live `--lifetime` seconds and answers a refresh after
`--refresh-ms` (a real provider's token endpoint takes tens to hundreds of milliseconds; loopback one or two). An
agent calls the API every `--pace` seconds for `--seconds`, through one `connector.http(user, provider)` context,
once with refresh on use (the default: the call that finds the token due waits for the refresh) and once with
refreshing ahead on (a background pass every second refreshes it before). Baseline: a plain httpx client with a
static bearer token, the same pace, in the same run. Reported: the median, 99th percentile and slowest call of
each, their ratio to the baseline, and how many refreshes reached the provider.

    .venv/bin/python -m bench.refresh_ahead [--seconds 30] [--lifetime 6] [--pace 0.02] [--refresh-ms 150] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx

from bench.harness import machine
from bench.token_use import connect_flows, deployment_in_tmp
from service.testing import MockOAuthProvider

PROACTIVE = {
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH": "true",
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH_INTERVAL_SECONDS": "1",
}


async def paced(seconds: float, pace: float, call: Callable[[], Awaitable[None]]) -> list[float]:
    """Each call's duration, one call every `pace` seconds for `seconds`."""
    durations: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        await call()
        durations.append(time.perf_counter() - start)
        await asyncio.sleep(max(0.0, pace - durations[-1]))
    return durations


async def agent_calls(
    lifetime: int, seconds: float, pace: float, refresh_delay: float, ahead: bool
) -> tuple[list[float], list[float], int]:
    """(the connector's call durations, the baseline's, refreshes that reached the provider)."""
    provider = MockOAuthProvider(expires_in=lifetime, refresh_delay=refresh_delay)
    env = {**PROACTIVE, "CONNECTOR_GRANTS__PROACTIVE_REFRESH_AHEAD_SECONDS": str(lifetime / 2)} if ahead else {}
    async with provider.serve_http(), deployment_in_tmp(provider, **env) as connector:
        user = connector.verifier.user()  # type: ignore[attr-defined]
        await connect_flows(connector, user, 1)
        token = provider.issued_access_tokens[-1]
        async with httpx.AsyncClient(
            base_url=f"{provider.base_url}/api/", headers={"Authorization": f"Bearer {token}"}
        ) as direct:

            async def baseline() -> None:
                (await direct.get("user")).raise_for_status()

            baseline_durations = await paced(seconds / 3, pace, baseline)
        await connect_flows(connector, user, 1)  # fresh tokens: the first call does not start on an expired one
        before = sum(1 for r in provider.token_requests if r.get("grant_type") == "refresh_token")
        async with connector.http(user, "github") as client:

            async def through_connector() -> None:
                (await client.get("user")).raise_for_status()

            durations = await paced(seconds, pace, through_connector)
        refreshes = sum(1 for r in provider.token_requests if r.get("grant_type") == "refresh_token") - before
    return durations, baseline_durations, refreshes


def row(label: str, durations: list[float], baseline: list[float], refreshes: int | str) -> str:
    cuts = statistics.quantiles(durations, n=100)
    base = statistics.quantiles(baseline, n=100)
    median, p99, worst = statistics.median(durations), cuts[98], max(durations)
    ms = 1000
    return (
        f"| {label} | {len(durations)} | {median * ms:.2f} ({median / statistics.median(baseline):.2f}x) "
        f"| {p99 * ms:.2f} ({p99 / base[98]:.2f}x) | {worst * ms:.2f} ({worst / max(baseline):.2f}x) | {refreshes} |"
    )


async def main(seconds: float, lifetime: int, pace: float, refresh_delay: float) -> None:
    on_use, base_a, refreshed_on_use = await agent_calls(lifetime, seconds, pace, refresh_delay, ahead=False)
    ahead, base_b, refreshed_ahead = await agent_calls(lifetime, seconds, pace, refresh_delay, ahead=True)
    print(f"Measured on {machine()}.")
    print(
        f"Tokens live {lifetime} s, a refresh takes the provider {refresh_delay * 1000:.0f} ms; a call every "
        f"{pace * 1000:.0f} ms for {seconds:.0f} s; milliseconds per call, "
        "and the ratio to a plain httpx client with a static token (same pace, same run).\n"
    )
    print("| mode | calls | median ms | p99 ms | slowest ms | refreshes |")
    print("|---|---|---|---|---|---|")
    print(row("baseline: httpx, static token", base_a + base_b, base_a + base_b, "-"))
    print(row("refresh on use (default)", on_use, base_a, refreshed_on_use))
    print(row("refreshing ahead", ahead, base_b, refreshed_ahead))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--lifetime", type=int, default=6)
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--refresh-ms", type=float, default=150.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run (10 s)")
    arguments = parser.parse_args()
    seconds = 10.0 if arguments.quick else arguments.seconds
    asyncio.run(main(seconds, arguments.lifetime, arguments.pace, arguments.refresh_ms / 1000))
