"""Refreshing ahead (`[grants] proactive_refresh`): a grant in use gets a new access token before its old one
expires, with no call waiting on it; a grant not used lately is left to its next use; off by default."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from .acp_peers import eventually
from .conftest import Deploy, Deployment
from .test_tokens import authorize, refreshes, stored_tokens

PROACTIVE = {
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH": "true",
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH_INTERVAL_SECONDS": "0.05",
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH_AHEAD_SECONDS": "120",
    "CONNECTOR_GRANTS__PROACTIVE_REFRESH_USED_WITHIN_SECONDS": "900",
}


async def use_once(deployment: Deployment) -> None:
    async with deployment.connector.http(deployment.local_user, "github") as github:
        assert (await github.get("user")).status_code == 200


async def refreshed(deployment: Deployment) -> bool:
    return refreshes(deployment) > 0


async def passes(deployment: Deployment, count: int = 6) -> None:
    """Let the background task look `count` times (its interval is 0.05 s here)."""
    await asyncio.sleep(0.05 * count)


async def test_a_grant_in_use_is_refreshed_before_it_expires_and_the_next_call_waits_for_nothing(
    deploy_with: Deploy,
) -> None:
    async with deploy_with(**PROACTIVE) as deployment:
        deployment.provider.expires_in = 600
        await authorize(deployment)
        await use_once(deployment)
        await passes(deployment)
        assert refreshes(deployment) == 0  # 600 s left: not yet

        deployment.connector.clock.advance(timedelta(seconds=500))  # 100 s left, within the 120 s ahead
        await eventually(lambda: refreshed(deployment), "the background task refreshed")
        await passes(deployment)
        assert refreshes(deployment) == 1  # once: the new token is not due again
        fresh = deployment.provider.issued_access_tokens[-1]
        assert (await stored_tokens(deployment))["access_token"] == fresh

        calls = len(deployment.provider.api_calls)
        await use_once(deployment)
        assert refreshes(deployment) == 1 and len(deployment.provider.api_calls) == calls + 1


async def test_a_grant_not_used_lately_waits_for_its_next_use(deploy_with: Deploy) -> None:
    env = {**PROACTIVE, "CONNECTOR_GRANTS__PROACTIVE_REFRESH_USED_WITHIN_SECONDS": "60"}
    async with deploy_with(**env) as deployment:
        deployment.provider.expires_in = 600
        await authorize(deployment)
        await use_once(deployment)
        deployment.connector.clock.advance(timedelta(seconds=500))  # due ahead, but last used 500 s ago
        await passes(deployment)
        assert refreshes(deployment) == 0
        await use_once(deployment)  # not due on use yet (100 s left): the stored token serves
        assert refreshes(deployment) == 0


async def test_a_dead_grant_refreshed_ahead_is_marked_needs_user_and_left_alone(deploy_with: Deploy) -> None:
    async with deploy_with(**PROACTIVE) as deployment:
        deployment.provider.expires_in = 600
        await authorize(deployment)
        await use_once(deployment)
        deployment.provider.revoke_refresh_tokens()  # revoked at the provider meanwhile: invalid_grant
        deployment.connector.clock.advance(timedelta(seconds=500))
        await eventually(lambda: refreshed(deployment), "the background task refreshed")
        await passes(deployment)
        assert refreshes(deployment) == 1  # never tried again
        (grant,) = await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")
        assert grant.health.needs_user


@pytest.mark.parametrize("env", [{}, {"CONNECTOR_GRANTS__PROACTIVE_REFRESH": "false"}])
async def test_off_by_default(deploy_with: Deploy, env: dict[str, str]) -> None:
    async with deploy_with(**env) as deployment:
        assert deployment.connector.runtime.proactive_refresh is None
