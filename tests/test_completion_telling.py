"""The telling of a completion is taken in the completing transaction, by the replica holding its connection.

The client hears `elicitation/complete` once and nobody can claim it again; a telling that no face of this process
starts is given back, so that the catch-up can tell it (nothing is left `delivering` by a live replica).
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select

from service.core import lifecycle
from service.core.records import ElicitationRecord, TokenSet
from service.core.scopes import SessionScope
from service.core.states import START_FROM, ElicitationStatus
from service.store.tables import elicitations
from service.testing import ScriptedBrowser

from .conftest import Deploy, Deployment
from .flow_support import asking
from .test_sql_per_flow import connect_flow


async def delivery_of(deployment: Deployment, elicitation_id: str) -> str | None:
    store = deployment.connector.runtime.store
    async with store.db.reader.connect() as conn:
        statement = select(elicitations.c.completion_delivery).where(elicitations.c.id == elicitation_id)
        return (await conn.execute(statement)).scalar_one()


async def test_a_completion_is_told_once_and_cannot_be_claimed_again(deploy_with: Deploy, database_url: str) -> None:
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        async with asking(deployment) as ask, ScriptedBrowser() as browser:
            elicitation_id = await connect_flow(ask, browser, "repo")
            await asyncio.sleep(0.2)
            assert await delivery_of(deployment, elicitation_id) == "sent"
            assert await deployment.connector.runtime.elicitations.claim_telling(elicitation_id) is None


async def test_a_telling_no_face_starts_is_given_back(
    deploy_with: Deploy, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "RELEASE_UNTOLD_AFTER", 0.05)
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        flows = deployment.connector.runtime.elicitations
        record = await flows.create(
            connection_key="held-by-no-face",
            user=deployment.local_user,
            provider="github",
            scopes=["repo"],
            scope=SessionScope("sess-1"),
            replica_id=flows.replica_id,
        )
        moved = await flows.store.elicitations.transition(
            record.id, ElicitationStatus.AUTHORIZING, now=flows.now(), from_=START_FROM
        )
        assert moved is not None
        assert await flows.finish(record, ElicitationStatus.COMPLETED, "completed", close_flows=False)
        assert await delivery_of(deployment, record.id) == "delivering"  # taken with the completion
        async with asyncio.timeout(5):
            while await delivery_of(deployment, record.id) is not None:  # noqa: ASYNC110 - a row another task changes
                await asyncio.sleep(0.05)
        assert await flows.claim_telling(record.id) is not None  # the catch-up's teller can take it now
        assert await flows.claim_telling(record.id) is None


async def test_a_first_grant_whose_account_has_one_by_now_replaces_it(deploy_with: Deploy, database_url: str) -> None:
    """The callback read no grant of the user at the provider, but one for the same account went in meanwhile: the
    completion's insert of a first grant writes nothing, and the grant is replaced as when one was held."""
    async with deploy_with(CONNECTOR_DATABASE__URL=database_url) as deployment:
        runtime = deployment.connector.runtime
        flows, store = runtime.elicitations, runtime.store
        provider = await runtime.browser.resolve("github")

        async def authorizing() -> ElicitationRecord:
            record = await flows.create(
                connection_key="held-by-no-face",
                user=deployment.local_user,
                provider="github",
                scopes=["repo"],
                scope=SessionScope("sess-1"),
            )
            moved = await store.elicitations.transition(
                record.id, ElicitationStatus.AUTHORIZING, now=flows.now(), from_=START_FROM
            )
            assert moved is not None
            return moved

        tokens = TokenSet("access", "Bearer", "refresh", None, ("repo",))
        earlier = await runtime.browser.complete(await authorizing(), provider, tokens, "account-1", held=False)
        assert earlier.status is ElicitationStatus.COMPLETED
        (first,) = await store.grants.find(deployment.local_user, "github")
        later = await runtime.browser.complete(await authorizing(), provider, tokens, "account-1", held=False)
        assert later.status is ElicitationStatus.COMPLETED
        (grant,) = await store.grants.find(deployment.local_user, "github")
        assert grant.id == first.id  # replaced, not a second row
        (completed,) = [r for r in await store.audit.list(elicitation_id=later.id) if r.event == "completed"]
        assert completed.detail["grant_id"] == first.id
