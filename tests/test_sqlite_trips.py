"""On SQLite, a connect flow's trips to the database connection's thread: each step's COMMIT rides in its
statement's trip where the step is one statement, or its transaction's last statement ends it (`sqlite_driver`:
`commit_each`, `commit_with_rows`). Counted by what each trip runs (`aiosqlite.Connection._execute`): a statement
(`_run`), or a COMMIT or ROLLBACK of its own. Deterministic: the background loops are set far apart."""

from __future__ import annotations

from collections import Counter

from service.testing import ScriptedBrowser

from .conftest import Deploy
from .flow_support import asking
from .test_sql_per_flow import QUIET, connect_flow, settled, statements
from .test_store_engine import trips_counted

# The transactions of a first connect flow whose COMMIT still takes a trip of its own: the elicitation's insert
# (`created`, and what the agent's call writes with it). The consent (`consented`), the consent page's read
# (`opened`), the start at Continue (`verified` with its flow row, one statement since migration 0021), the
# callback's claim, the completion and the telling's settle commit in their statements' trips.
OWN_COMMITS = 1


async def test_a_connect_flow_commits_in_its_statements_trips(deploy_with: Deploy, tmp_path: object) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/trips.db"
    async with deploy_with(CONNECTOR_DATABASE__URL=url, **QUIET) as deployment:
        store = deployment.connector.runtime.store
        async with asking(deployment) as ask, ScriptedBrowser() as browser:
            await connect_flow(ask, browser, "warm-up")
            for grant in await store.grants.find(deployment.local_user, "github"):
                assert await store.grants.delete(grant.id)
            with trips_counted() as trips, statements(deployment) as seen:
                await connect_flow(ask, browser, "first")
                await settled(seen)
    counted = Counter(trips)
    assert counted["commit"] == OWN_COMMITS, counted
    assert counted["rollback"] == 0, counted
    assert counted["_run"] == len(seen), (counted, seen)  # one trip a statement
