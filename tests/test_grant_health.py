"""Grants that stay alive, and say why when they do not: a refresh the provider refuses for good marks the grant
`needs_user` (kept, never refreshed again, with a reason and a `grant.needs_user` event), a transient failure (503,
429 with Retry-After, a timeout) changes no stored token, raises the retryable `ProviderUnavailable` and backs off,
and the provider's recovery lets the next use succeed with no user involved. Against the mock provider, in process.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service import (
    AuthorizationStatus,
    GrantEvent,
    GrantEventKind,
    GrantNeedsUser,
    GrantStatus,
    HealthReason,
    ProviderUnavailable,
    SessionScope,
)
from service.core.health import reason_sentence
from service.store import tables
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect
from .conftest import Deploy, Deployment
from .test_tokens import authorize, refreshes, stored_tokens

LIFETIME = 30


def expire(deployment: Deployment, seconds: float = LIFETIME + 1) -> None:
    """Move the connector's clock past the access token's life: it cannot serve while a refresh fails."""
    deployment.connector.clock.advance(timedelta(seconds=seconds))


async def use(deployment: Deployment) -> int:
    async with deployment.connector.http(deployment.local_user, "github") as github:
        return (await github.get("user")).status_code


async def the_grant(deployment: Deployment) -> Any:
    (grant,) = await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")
    return grant


async def logged_rows(deployment: Deployment) -> list[dict[str, Any]]:
    """The grant events in the event log, as stored."""
    async with deployment.connector.runtime.store.engine.connect() as conn:
        table = tables.elicitation_events
        statement = select(table).where(table.c.kind.is_not(None)).order_by(table.c.id)
        return [dict(row) for row in (await conn.execute(statement)).mappings().all()]


def secrets_of(deployment: Deployment) -> list[str]:
    provider = deployment.provider
    return [*provider.issued_access_tokens, *provider.issued_refresh_tokens, provider.client_secret]


OUTAGES = {
    "503": lambda provider: provider.token_outages.append((503, {})),
    "429 with Retry-After": lambda provider: provider.token_outages.append((429, {"retry-after": "40"})),
    "timeout": lambda provider: setattr(provider, "token_timeouts", 1),
}


@pytest.mark.parametrize("outage", list(OUTAGES))
async def test_a_transient_failure_keeps_the_grant_and_backs_off_until_the_provider_recovers(
    deployment: Deployment, outage: str
) -> None:
    provider = deployment.provider
    provider.expires_in = LIFETIME
    await authorize(deployment)
    before, asked = await stored_tokens(deployment), len(provider.authorization_requests)
    expire(deployment)
    OUTAGES[outage](provider)

    with pytest.raises(ProviderUnavailable) as unavailable:
        await use(deployment)
    assert unavailable.value.retry_after is not None and unavailable.value.retry_after > 0
    if outage == "429 with Retry-After":
        assert unavailable.value.retry_after >= 40  # the provider's own wait is honoured
    grant = await the_grant(deployment)
    assert grant.health.status is GrantStatus.ACTIVE and grant.health.failures == 1
    assert await stored_tokens(deployment) == before  # no stored token changed
    assert refreshes(deployment) == 1

    # Within the backoff: the retryable error again, and no request reaches the provider.
    with pytest.raises(ProviderUnavailable):
        await use(deployment)
    assert refreshes(deployment) == 1

    # The provider recovered and the backoff ran out: the next use succeeds, nobody was asked anything.
    deployment.connector.clock.advance(timedelta(minutes=6))
    assert await use(deployment) == 200
    assert refreshes(deployment) == 2 and len(provider.authorization_requests) == asked
    healed = await the_grant(deployment)
    assert healed.health.status is GrantStatus.ACTIVE and healed.health.failures == 0
    assert healed.health.next_attempt_at is None and healed.health.last_refresh_at is not None
    failures = await deployment.connector.runtime.store.audit.list(event="refresh_failed")
    assert [e.detail["verdict"] for e in failures] == ["unavailable"]
    assert await logged_rows(deployment) == []  # nothing the agents are told about: the grant never stopped


async def test_a_refresh_token_refused_for_good_marks_the_grant_needs_user_once(
    deployment: Deployment, captured_logs: pytest.LogCaptureFixture
) -> None:
    provider = deployment.provider
    provider.expires_in = LIFETIME
    await authorize(deployment)
    before = await stored_tokens(deployment)
    heard: list[GrantEvent] = []
    deployment.connector.on_grant_event(heard.append)
    provider.revoke_refresh_tokens()  # the user revoked the app at the provider
    expire(deployment)

    with pytest.raises(GrantNeedsUser) as refused:
        await use(deployment)
    assert refused.value.reason == "revoked"
    assert refused.value.sentence == "Mock Provider access was revoked or has expired on Mock Provider's side"
    grant = await the_grant(deployment)  # kept, with its account and scopes and tokens
    assert (grant.health.status, grant.health.reason) == (GrantStatus.NEEDS_USER, HealthReason.REVOKED)
    assert await stored_tokens(deployment) == before

    # Never refreshed again: every later use says why, and no request reaches the provider.
    for _ in range(3):
        with pytest.raises(GrantNeedsUser, match="revoked or has expired"):
            await use(deployment)
    assert refreshes(deployment) == 1

    (row,) = await logged_rows(deployment)
    assert (row["kind"], row["elicitation_id"]) == ("grant.needs_user", grant.id)
    assert json.loads(row["detail"]) == {
        "issuer": grant.identity.issuer,
        "subject": grant.identity.subject,
        "provider": "github",
        "account_id": grant.provider_account_id,
        "reason": "revoked",
    }
    assert [(e.kind, e.grant_id, e.reason) for e in heard] == [(GrantEventKind.NEEDS_USER, grant.id, "revoked")]
    audit = await deployment.connector.runtime.store.audit.list(event="grant_needs_user")
    assert [e.detail for e in audit] == [{"grant_id": grant.id, "reason": "revoked"}]

    # No secret anywhere the reason went: the error, the event, the audit trail, the logs.
    told = " ".join(
        [str(refused.value), json.dumps(row, default=str), *(json.dumps(e.detail) for e in audit), captured_logs.text]
    )
    assert not [secret for secret in secrets_of(deployment) if secret in told]


async def test_a_provider_specific_dead_refresh_token_error_with_http_200_is_definitive(deploy_with: Deploy) -> None:
    """GitHub answers a dead refresh token with HTTP 200 and error=bad_refresh_token: the catalog entry lists it."""
    async with deploy_with(
        CONNECTOR_PROVIDERS__GITHUB__DEAD_REFRESH_TOKEN_ERRORS="invalid_grant,bad_refresh_token"
    ) as deployment:
        deployment.provider.expires_in = LIFETIME
        await authorize(deployment)
        deployment.provider.token_errors.append("bad_refresh_token")
        expire(deployment)
        with pytest.raises(GrantNeedsUser):
            await use(deployment)
        assert (await the_grant(deployment)).health.status is GrantStatus.NEEDS_USER


async def test_an_unlisted_oauth_refusal_is_not_the_users_problem(deployment: Deployment) -> None:
    """invalid_client is our configuration's fault: the grant stays active, refreshes back off."""
    deployment.provider.expires_in = LIFETIME
    await authorize(deployment)
    deployment.provider.token_errors.append("invalid_client")
    expire(deployment)
    with pytest.raises(Exception, match="invalid_client") as refused:
        await use(deployment)
    assert not isinstance(refused.value, GrantNeedsUser | ProviderUnavailable)
    grant = await the_grant(deployment)
    assert grant.health.status is GrantStatus.ACTIVE and grant.health.failures == 1


async def test_concurrent_uses_during_an_outage_make_one_attempt(deployment: Deployment) -> None:
    deployment.provider.expires_in = LIFETIME
    await authorize(deployment)
    deployment.provider.token_outages.extend([(503, {})] * 10)
    expire(deployment)
    async with deployment.connector.http(deployment.local_user, "github") as github:
        results = await asyncio.gather(*(github.get("user") for _ in range(8)), return_exceptions=True)
    assert {type(r).__name__ for r in results} == {"ProviderUnavailable"}
    assert refreshes(deployment) == 1


def test_every_reason_has_a_sentence_that_names_only_the_provider() -> None:
    for reason in HealthReason:
        sentence = reason_sentence(reason, "GitHub")
        assert sentence is not None and "GitHub" in sentence
        assert sentence.replace("GitHub", "") == (reason_sentence(reason, "") or "")  # nothing else is filled in


async def test_metrics_count_refresh_outcomes_by_reason(deployment: Deployment) -> None:
    deployment.provider.expires_in = LIFETIME
    await authorize(deployment)
    deployment.provider.token_outages.append((503, {}))
    expire(deployment)
    with pytest.raises(ProviderUnavailable):
        await use(deployment)
    deployment.connector.clock.advance(timedelta(minutes=6))
    deployment.provider.revoke_refresh_tokens()
    with pytest.raises(GrantNeedsUser):
        await use(deployment)
    metrics = deployment.connector.runtime.metrics
    assert metrics is not None
    rendered = (await metrics.render())[0].decode()
    for line in (
        'acp_connector_token_refreshes_total{provider="github",result="unavailable"} 1.0',
        'acp_connector_token_refreshes_total{provider="github",result="needs_user"} 1.0',
        'acp_connector_token_refresh_failures_total{provider="github",reason="http_5xx"} 1.0',
        'acp_connector_token_refresh_failures_total{provider="github",reason="revoked"} 1.0',
    ):
        assert line in rendered, line


async def ask(deployment: Deployment, scopes: list[str]) -> tuple[Any, list[str]]:
    """Ask for `scopes` over a real ACP connection; walk the browser if an elicitation comes. (outcome, messages)."""
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    request = asyncio.create_task(
        deployment.connector.request_authorization(
            wire.agent.conn, user=deployment.local_user, provider="github", scopes=scopes, scope=SessionScope("s")
        )
    )
    link = asyncio.ensure_future(client.urls.get())
    await asyncio.wait({request, link}, return_when="FIRST_COMPLETED")
    if link.done():
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(link.result())).status_code == 200
    link.cancel()
    outcome = await asyncio.wait_for(request, 10)
    messages = [m["params"]["message"] for m in wire.received("elicitation/create")]
    await wire.close()
    return outcome, messages


async def test_one_more_scope_updates_the_same_grant_and_keeps_what_it_held(deployment: Deployment) -> None:
    provider = deployment.provider
    first, _ = await ask(deployment, ["repo"])
    assert first.ok and first.grant is not None
    provider.issue_refresh_token = False  # like Google: no new refresh token at a later consent
    held = (await stored_tokens(deployment))["refresh_token"]

    more, messages = await ask(deployment, ["gist"])
    assert more.status is AuthorizationStatus.AUTHORIZED and more.grant is not None
    assert messages == [
        "Authorize more access to your Mock Provider account: gist, in addition to what it already granted (repo)."
    ]
    assert provider.authorization_requests[-1]["scope"] == "repo gist"  # the union was asked for
    (grant,) = await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")  # one row
    assert grant.id == first.grant.id and set(grant.scopes) == {"repo", "gist"}
    assert (await stored_tokens(deployment))["refresh_token"] == held  # not lost: the provider did not take it back
    again, messages = await ask(deployment, ["gist"])
    assert again.status is AuthorizationStatus.ALREADY_AUTHORIZED and messages == []
