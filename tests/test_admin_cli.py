"""`acp-connector grants|elicitations|audit ...`: the console's operations from the command line, their JSON, keyset
paging, and the audit lines naming the CLI's operator."""

from __future__ import annotations

import asyncio
import csv
import getpass
import io
import json

from service.cli import main

from .admin_support import ACCESS_TOKEN, OPERATOR_KEY, seeded_console
from .conftest import Deploy


def run_cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), env=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def cli(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    return await asyncio.to_thread(run_cli, env, *argv)


async def test_the_commands_answer_in_json(deploy_with: Deploy, connector_env: dict[str, str]) -> None:
    async with seeded_console(deploy_with) as seeded:
        store = seeded.deployment.connector.runtime.store
        user = seeded.deployment.local_user
        code, out, err = await cli(connector_env, "grants", "list", "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert listed["next"] is None
        [grant] = listed["items"]
        assert grant["id"] == seeded.grant.id and grant["subject"] == user.subject and grant["status"] == "active"
        assert grant["account"] == "acct-1" and grant["scopes"] == ["read"] and grant["reason"] is None
        assert ACCESS_TOKEN not in out and grant["tenant"] == seeded.grant.tenant
        code, out, _ = await cli(connector_env, "grants", "list", "--tenant", "agent-b", "--json")
        assert code == 0 and json.loads(out)["items"] == []

        code, out, _ = await cli(connector_env, "elicitations", "list", "--json")
        [pending] = json.loads(out)["items"]
        assert pending["id"] == seeded.elicitation_id and pending["tenant"] == "agent-a"
        assert pending["status"] == "pending"

        code, out, err = await cli(connector_env, "elicitations", "cancel", seeded.elicitation_id, "--json")
        assert code == 0, err
        assert json.loads(out) == {"elicitationId": seeded.elicitation_id, "cancelled": True}
        assert (await store.elicitations.get(seeded.elicitation_id)).status.value == "cancelled"  # type: ignore[union-attr]
        code, out, _ = await cli(connector_env, "elicitations", "cancel", seeded.elicitation_id, "--json")
        assert code == 1 and json.loads(out)["cancelled"] is False
        code, out, _ = await cli(connector_env, "elicitations", "list", "--json")
        assert json.loads(out)["items"] == []
        code, out, _ = await cli(connector_env, "elicitations", "list", "--recent", "--json")
        assert [e["status"] for e in json.loads(out)["items"]] == ["cancelled"]

        code, out, err = await cli(connector_env, "grants", "revoke", seeded.grant.id, "--json")
        assert code == 0, err  # once seen exiting 2 under a loaded full run: its line says why
        assert json.loads(out) == {"grantId": seeded.grant.id, "revoked": True}
        assert await store.grants.get(seeded.grant.id) is None

        operator = f"cli:{getpass.getuser()}"
        code, out, _ = await cli(connector_env, "audit", "list", "--event", "disconnected", "--json")
        [line] = json.loads(out)["items"]
        assert line["detail"]["operator"] == operator and line["detail"]["via"] == "cli"
        assert line["detail"]["grant_id"] == seeded.grant.id and line["subject"] == user.subject
        code, out, _ = await cli(
            connector_env, "audit", "list", "--user", user.subject, "--event", "cancelled", "--json"
        )
        [line] = json.loads(out)["items"]
        assert line["elicitationId"] == seeded.elicitation_id and line["detail"]["operator"] == operator
        code, out, _ = await cli(connector_env, "audit", "list", "--event", "cancelled", "--csv")
        [row] = list(csv.DictReader(io.StringIO(out)))
        assert row["elicitation_id"] == seeded.elicitation_id
        assert OPERATOR_KEY not in out and seeded.agent_key not in out


async def test_paging_walks_every_row_once(deploy_with: Deploy, connector_env: dict[str, str]) -> None:
    async with seeded_console(deploy_with) as seeded:
        store = seeded.deployment.connector.runtime.store
        for i in range(5):
            await store.audit.record("refreshed", provider="github", detail={"n": i})
        seen: list[int] = []
        after: list[str] = []
        while True:
            code, out, err = await cli(
                connector_env, "audit", "list", "--event", "refreshed", "--limit", "2", "--json", *after
            )
            assert code == 0, err
            page = json.loads(out)
            seen += [item["detail"]["n"] for item in page["items"]]
            if page["next"] is None:
                break
            after = ["--after", page["next"]]
        assert seen == [4, 3, 2, 1, 0]
        for argv in (
            ("audit", "list", "--after", "nonsense"),
            ("grants", "list", "--after", "nonsense"),
            ("elicitations", "list", "--after", "nonsense"),
            ("audit", "list", "--since", "yesterday"),
            ("grants", "list", "--limit", "0"),
        ):
            code, out, err = await cli(connector_env, *argv)
            assert code == 2 and "Traceback" not in err, (argv, err)
        code, out, _ = await cli(connector_env, "grants", "revoke", "no-such-grant")
        assert code == 1 and "nothing done" in out
