"""Decline, like Continue, takes effect only after the identity step (on SQLite and PostgreSQL). Before it, a browser
holding the link sees "this link is not for you" (audited) and the elicitation goes on for its user; neither the
decline attempt nor its mismatch counts towards the identity lock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from service import ElicitationStatus
from service.testing import ScriptedBrowser

from .conftest import ALICE, Deploy, Deployment
from .identity_support import LoopbackIdP, events, last_event, page_reveals_no_identity, serve_idp, started, wait_status
from .test_identity_confirm import confirm, confirm_env

BOB_HEADERS = {"X-Forwarded-User": "bob"}
ALICE_HEADERS = {"X-Forwarded-User": "alice"}
PROXY = {
    "CONNECTOR_IDENTITY__VERIFIER": "trusted_header",
    "CONNECTOR_IDENTITY__TRUSTED_HEADER__ISSUER": ALICE.issuer,
    "CONNECTOR_SERVER__TRUSTED_PROXIES": "127.0.0.1/32",  # the test's loopback peer plays the proxy
    "CONNECTOR_IDENTITY__MAX_MISMATCHES": "2",
}


@pytest.fixture
async def proxied(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(ALICE, CONNECTOR_DATABASE__URL=database_url, **PROXY) as deployment:
        yield deployment


def assert_not_for_you(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    assert answer.headers["x-connector-error"] == "not_your_link"
    assert "not for you" in answer.text
    assert page_reveals_no_identity(answer.text, ALICE)


async def status(deployment: Deployment, elicitation_id: str) -> ElicitationStatus:
    record = await deployment.connector.elicitation(elicitation_id)
    assert record is not None
    return record.status


async def test_someone_else_holding_the_link_cannot_decline(proxied: Deployment) -> None:
    async with started(proxied, ALICE) as pending:
        await wait_status(proxied, pending.elicitation_id, ElicitationStatus.CONSENTED)
        async with ScriptedBrowser(headers=BOB_HEADERS) as bob:
            page = await bob.get(pending.url)
            # Three tries, more than max_mismatches: a decline attempt never locks the elicitation either.
            for _ in range(3):
                assert_not_for_you(await bob.submit(page, "decline"))
        assert await status(proxied, pending.elicitation_id) is ElicitationStatus.CONSENTED
        refused = await last_event(proxied, "decline_refused")
        assert refused.elicitation_id == pending.elicitation_id
        assert refused.detail["browser_subject"] == "bob"
        assert "declined" not in await events(proxied, pending.elicitation_id)
        assert "identity_mismatch" not in await events(proxied, pending.elicitation_id)
        assert pending.wire.received("elicitation/complete") == []

        # The rightful user can still decline: then it ends, once.
        async with ScriptedBrowser(headers=ALICE_HEADERS) as alice:
            page = await alice.get(pending.url)
            declined = await alice.submit(page, "decline")
        assert declined.status_code == 200 and "You declined" in declined.text
        assert await status(proxied, pending.elicitation_id) is ElicitationStatus.DECLINED


async def test_a_browser_the_proxy_did_not_sign_in_cannot_decline(proxied: Deployment) -> None:
    async with started(proxied, ALICE) as pending:
        await wait_status(proxied, pending.elicitation_id, ElicitationStatus.CONSENTED)
        async with ScriptedBrowser() as anonymous:
            page = await anonymous.get(pending.url)
            answer = await anonymous.submit(page, "decline")
        assert answer.status_code == 403 and answer.headers["x-connector-error"] == "not_signed_in"
        assert await status(proxied, pending.elicitation_id) is ElicitationStatus.CONSENTED


# --- a verifier that sends the browser away first ------------------------------------------------------------


@pytest.fixture
async def idp() -> AsyncIterator[LoopbackIdP]:
    async with serve_idp(LoopbackIdP()) as served:
        yield served


@pytest.fixture
async def sso(idp: LoopbackIdP, deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(
        idp.identity("alice"),
        CONNECTOR_DATABASE__URL=database_url,
        CONNECTOR_IDENTITY__VERIFIER="oidc",
        CONNECTOR_IDENTITY__OIDC__DISCOVERY_URL=idp.discovery_url,
        CONNECTOR_IDENTITY__OIDC__CLIENT_ID=idp.client_id,
    ) as deployment:
        yield deployment


async def decline_through_sign_in(browser: ScriptedBrowser, connect_url: str) -> httpx.Response:
    """Press Decline: the browser signs in at the IdP first, then comes back."""
    page = await browser.get(connect_url)
    to_idp = await browser.submit(page, "decline")
    assert to_idp.status_code == 303, to_idp.text
    return await browser.follow(to_idp)


@pytest.mark.parametrize("who", ["alice", "bob"])
async def test_decline_with_sign_in_first_takes_effect_only_for_the_bound_user(
    sso: Deployment, idp: LoopbackIdP, who: str
) -> None:
    async with started(sso, idp.identity("alice")) as pending:
        await wait_status(sso, pending.elicitation_id, ElicitationStatus.CONSENTED)
        idp.logged_in = who
        async with ScriptedBrowser() as browser:
            final = await decline_through_sign_in(browser, pending.url)
        assert idp.authorize_requests, "Decline did not go through the sign-in"
        if who == "alice":
            assert final.status_code == 410 and final.headers["x-connector-error"] == "declined"
            assert await status(sso, pending.elicitation_id) is ElicitationStatus.DECLINED
        else:
            assert_not_for_you(final)
            assert await status(sso, pending.elicitation_id) is ElicitationStatus.CONSENTED
            assert "identity_mismatch" not in await events(sso, pending.elicitation_id)
        assert sso.provider.issued_codes == []  # never sent to the provider


# --- the operator's app confirms who is in the browser ---------------------------------------------------------


@pytest.fixture
async def operated(deploy_with: Deploy, database_url: str) -> AsyncIterator[Deployment]:
    async with deploy_with(ALICE, CONNECTOR_DATABASE__URL=database_url, **confirm_env()) as deployment:
        yield deployment


@pytest.mark.parametrize("who", ["alice", "bob"])
async def test_decline_through_the_operator_takes_effect_only_for_the_bound_user(
    operated: Deployment, who: str
) -> None:
    async with started(operated, ALICE) as pending:
        await wait_status(operated, pending.elicitation_id, ElicitationStatus.CONSENTED)
        async with ScriptedBrowser() as browser:
            page = await browser.get(pending.url)
            leaving = await browser.submit(page, "decline")
            assert leaving.status_code == 303, leaving.text
            flow_id = parse_qs(urlsplit(leaving.headers["location"]).query)["flow_id"][0]
            answer = await confirm(operated, {"flow_id": flow_id, "user_id": who})
            back = await browser.follow(await browser.get(answer.json()["next_uri"]))
        if who == "alice":
            assert answer.status_code == 200
            assert back.status_code == 410 and back.headers["x-connector-error"] == "declined"
            assert await status(operated, pending.elicitation_id) is ElicitationStatus.DECLINED
        else:
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "not_your_link"
            assert_not_for_you(back)
            assert await status(operated, pending.elicitation_id) is ElicitationStatus.CONSENTED
            assert "identity_mismatch" not in await events(operated, pending.elicitation_id)
