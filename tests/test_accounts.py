"""Several accounts per provider: a user holds grants for two accounts at one provider (work and personal), and each
call names the one it means with `account` (an account id or the label the user gave on the consent page).

On both faces against a real loopback server and the mock provider: the embedded connector (`request_authorization`
over a real ACP connection, `http`) and the `/v1` API (elicitations, grants, the proxy with `Connector-Account`, and
the Python `SidecarClient` on it). Without `account`, one account answers as before and two raise
`AccountChoiceNeeded` (409 `account_choice_needed` on `/v1`) naming them by label only; a new account is asked with
the provider's account chooser (`prompt=select_account`), one asked again is named (`login`); one more scope
updates that account's grant only.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from service import AccountChoiceNeeded, AuthorizationStatus, FlowRefused, NotAuthorized, SessionScope
from service.client import SidecarClient
from service.core.accounts import AccountAsk, choose, clean_label, label_for, unique_label
from service.testing import ScriptedBrowser

from .acp_peers import RecordingClient, connect
from .api_support import api_client, create_body, make_key, user_headers
from .conftest import Deployment
from .test_grants_listing import run_cli
from .test_store import grant

WORK = {"id": 4242, "login": "octocat", "name": "Mona"}
PERSONAL = {"id": 777, "login": "mona-at-home", "name": "Mona"}


async def requesting(
    deployment: Deployment, client: RecordingClient, scopes: list[str], account: str | None
) -> tuple[Any, asyncio.Task[Any]]:
    """The client's connection, and `request_authorization` for `account` running on it."""
    wire = await connect(deployment.connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    request = asyncio.create_task(
        deployment.connector.request_authorization(
            wire.agent.conn,
            user=deployment.local_user,
            provider="github",
            scopes=scopes,
            scope=SessionScope("s"),
            account=account,
        )
    )
    return wire, request


async def ask(
    deployment: Deployment, scopes: list[str], *, account: str | None = None, label: str | None = None
) -> tuple[Any, list[str]]:
    """Ask over a real ACP connection for `account`; walk the browser (typing `label`) if an elicitation comes."""
    client = RecordingClient(answer="accept")
    wire, request = await requesting(deployment, client, scopes, account)
    link = asyncio.ensure_future(client.urls.get())
    try:
        await asyncio.wait({request, link}, return_when="FIRST_COMPLETED")
        if link.done():
            fields = {} if label is None else {"account_label": label}
            async with ScriptedBrowser() as browser:
                assert (await browser.authorize(link.result(), **fields)).status_code == 200
        outcome = await asyncio.wait_for(request, 10)
    finally:
        link.cancel()
        messages = [m["params"]["message"] for m in wire.received("elicitation/create")]
        await wire.close()
    return outcome, messages


async def github_login(deployment: Deployment, **account: str) -> str:
    async with deployment.connector.http(deployment.local_user, "github", **account) as github:
        answer = await github.get("user")
    assert answer.status_code == 200
    return str(answer.json()["login"])


async def grants_of(deployment: Deployment) -> list[Any]:
    return await deployment.connector.runtime.store.grants.find(deployment.local_user, "github")


async def test_two_accounts_each_chosen_by_account_on_the_embedded_face(deployment: Deployment) -> None:
    provider = deployment.provider
    provider.account = WORK
    first, _ = await ask(deployment, ["repo"], label="work")
    assert first.status is AuthorizationStatus.AUTHORIZED
    assert (first.grant.account_id, first.grant.account_label, first.grant.account_name) == ("4242", "work", "octocat")
    assert "prompt" not in provider.authorization_requests[-1]  # a first account: nothing to choose from
    # One account: no `account` needed, as before.
    again, messages = await ask(deployment, ["repo"])
    assert again.status is AuthorizationStatus.ALREADY_AUTHORIZED and messages == []
    assert await github_login(deployment) == "octocat"

    # Another account: named but not held, so it is asked for although "work" covers the scopes, with GitHub's
    # account chooser; the consent page offers the name the agent gave.
    provider.account = PERSONAL
    second, messages = await ask(deployment, ["repo"], account="personal")
    assert second.status is AuthorizationStatus.AUTHORIZED and len(messages) == 1
    assert provider.authorization_requests[-1]["prompt"] == "select_account"
    assert (second.grant.account_id, second.grant.account_label, second.grant.account_name) == (
        "777",
        "personal",
        "mona-at-home",
    )
    assert len(await grants_of(deployment)) == 2

    # Two accounts: without `account`, a typed error naming them by label; with it, the account named.
    with pytest.raises(AccountChoiceNeeded) as raised:
        await github_login(deployment)
    assert raised.value.code == "account_choice_needed"
    assert raised.value.labels == ("personal", "work")  # newest first
    assert "'personal', 'work'" in str(raised.value)
    for secret in provider.secrets_issued():
        assert secret not in str(raised.value)
    with pytest.raises(AccountChoiceNeeded):
        await ask(deployment, ["repo"])
    assert await github_login(deployment, account="work") == "octocat"
    assert await github_login(deployment, account="PERSONAL") == "mona-at-home"  # a label, whatever its case
    assert await github_login(deployment, account="4242") == "octocat"  # the provider's account id
    assert await github_login(deployment, account="mona-at-home") == "mona-at-home"  # the provider's name for it
    with pytest.raises(NotAuthorized):
        await github_login(deployment, account="school")
    held, messages = await ask(deployment, ["repo"], account="work")
    assert held.status is AuthorizationStatus.ALREADY_AUTHORIZED and held.grant.account_id == "4242"
    assert messages == []
    assert (await deployment.connector.find_grant(deployment.local_user, "github", account="personal")).account_id == (
        "777"  # type: ignore[union-attr]
    )


async def test_one_more_scope_for_one_account_updates_that_grant_only(deployment: Deployment) -> None:
    provider = deployment.provider
    provider.account = WORK
    await ask(deployment, ["repo"], label="work")
    provider.account = PERSONAL
    await ask(deployment, ["repo"], account="personal")
    before = {g.account_label: g for g in await grants_of(deployment)}

    provider.account = WORK  # the user signs in to the account named (`login` tells GitHub which)
    more, messages = await ask(deployment, ["gist"], account="work")
    assert more.status is AuthorizationStatus.AUTHORIZED
    assert provider.authorization_requests[-1] == {"scope": "repo gist", "login": "octocat"}  # the union, named
    assert messages == [
        "Authorize more access to your Mock Provider account: gist, in addition to what it already granted (repo)."
    ]
    after = {g.account_label: g for g in await grants_of(deployment)}
    assert set(after) == {"work", "personal"}  # still one row per account
    assert after["work"].id == before["work"].id and set(after["work"].scopes) == {"repo", "gist"}
    assert after["personal"] == before["personal"]  # the other account is untouched
    assert after["work"].account_label == "work"  # asked again without a name: the label stays


async def test_the_label_is_checked_and_shown_escaped(deployment: Deployment) -> None:
    provider = deployment.provider
    client = RecordingClient(answer="accept")
    wire = await connect(deployment.connector, deployment.local_user, client)
    assert wire.agent.conn is not None
    request = asyncio.create_task(
        deployment.connector.request_authorization(
            wire.agent.conn, user=deployment.local_user, provider="github", scopes=["repo"], scope=SessionScope("s")
        )
    )
    url = await client.next_url()
    async with ScriptedBrowser() as browser:
        page = await browser.get(url)
        assert 'name="account_label"' in page.text and "Name this account" in page.text
        refused = await browser.submit(page, "continue", account_label="<script>alert(1)</script>")
        assert refused.status_code == 400 and "invalid_account_label" in refused.text
        assert "<script>alert" not in refused.text
        assert not provider.authorization_requests  # refused before anything went to the provider
        too_long = await browser.submit(page, "continue", account_label="x" * 65)
        assert too_long.status_code == 400
        done = await browser.follow(await browser.submit(page, "continue", account_label='  Tom  & "Jerry" '))
    assert done.status_code == 200
    assert "Tom &amp; &#34;Jerry&#34; (octocat)" in done.text  # escaped on the page after the provider
    assert 'Tom & "Jerry"' not in done.text
    outcome = await asyncio.wait_for(request, 10)
    await wire.close()
    assert outcome.grant.account_label == 'Tom & "Jerry"'  # spaces trimmed and collapsed
    for secret in provider.secrets_issued():
        assert secret not in done.text and secret not in json.dumps(outcome.grant.account_label)


async def test_the_consent_page_names_the_accounts_held_and_offers_the_new_ones_name(deployment: Deployment) -> None:
    provider = deployment.provider
    provider.account = WORK
    await ask(deployment, ["repo"], label="work & co")
    client = RecordingClient(answer="accept")
    wire, request = await requesting(deployment, client, ["repo"], "home")
    async with ScriptedBrowser() as browser:
        page = await browser.get(await client.next_url())
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    await wire.close()
    assert '<span class="account">work &amp; co</span>' in page.text
    assert 'value="home"' in page.text


async def test_two_accounts_on_the_v1_face(deployment: Deployment) -> None:
    provider = deployment.provider
    key = await make_key(deployment.connector.runtime.store)
    user = deployment.local_user
    async with api_client(deployment.base_url, key) as api:
        for account, signed_in in (("work", WORK), ("personal", PERSONAL)):
            provider.account = signed_in
            created = await api.post("/v1/elicitations", json=create_body(user, account=account))
            assert created.status_code == 201, created.text
            async with ScriptedBrowser() as browser:
                assert (await browser.authorize(created.json()["url"])).status_code == 200
        assert provider.authorization_requests[-1]["prompt"] == "select_account"

        ambiguous = await api.post("/v1/elicitations", json=create_body(user))
        assert ambiguous.status_code == 409
        error = ambiguous.json()["error"]
        assert error["code"] == "account_choice_needed" and error["labels"] == ["personal", "work"]
        assert "'personal', 'work'" in error["message"]
        chosen = await api.post("/v1/elicitations", json=create_body(user, account="work"))
        assert chosen.status_code == 200 and chosen.json()["status"] == "already_authorized"
        assert chosen.json()["grant"]["accountId"] == "4242"

        listed = (await api.get("/v1/grants", params={"issuer": user.issuer, "subject": user.subject})).json()
        assert sorted((g["accountId"], g["accountLabel"], g["accountName"]) for g in listed["grants"]) == [
            ("4242", "work", "octocat"),
            ("777", "personal", "mona-at-home"),
        ]

        proxied = "/v1/proxy/github/user"
        unnamed = await api.get(proxied, headers=user_headers(user))
        assert unnamed.status_code == 409 and unnamed.json()["error"]["labels"] == ["personal", "work"]
        work = await api.get(proxied, headers={**user_headers(user), "Connector-Account": "work"})
        assert work.status_code == 200 and work.json()["login"] == "octocat"
        home = await api.get(proxied, headers={**user_headers(user), "Connector-Account": "777"})
        assert home.status_code == 200 and home.json()["login"] == "mona-at-home"
        unknown = await api.get(proxied, headers={**user_headers(user), "Connector-Account": "school"})
        assert unknown.status_code == 403 and unknown.json()["error"]["code"] == "unknown_account"
        text = json.dumps([ambiguous.json(), unnamed.json(), listed])
    for secret in provider.secrets_issued():
        assert secret not in text
    assert "Connector-Account" not in str(provider.api_calls)

    async with SidecarClient(deployment.base_url, key) as sidecar:
        with pytest.raises(AccountChoiceNeeded) as raised:
            await sidecar.find_grant(user, "github")
        assert raised.value.labels == ("personal", "work")
        found = await sidecar.find_grant(user, "github", account="personal")
        assert found is not None and (found.account_id, found.account_label) == ("777", "personal")
        async with sidecar.http(user, "github", account="work") as github:
            assert (await github.get("user")).json()["login"] == "octocat"


def test_labels_are_checked_trimmed_and_kept_unique() -> None:
    assert clean_label("  work   laptop ") == "work laptop"
    assert clean_label("   ") is None and clean_label(None) is None
    for bad in ("a" * 65, "tab\x07bell", "<b>", "x>y", "zero\x00"):
        with pytest.raises(FlowRefused) as raised:
            clean_label(bad)
        assert raised.value.code == "invalid_account_label"
    work = replace(grant(account="1"), account_label="work", account_name="octocat")
    home = replace(grant(account="2"), account_label="Work (2)", account_name=None)
    assert unique_label("WORK", "3", [work, home]) == "WORK (3)"
    assert unique_label("work", "1", [work, home]) == "work"  # its own label is no clash
    assert unique_label("octocat", "3", [work]) == "octocat (2)"  # nor may it read as another's profile name
    # Asked again without a name: the label it had; a first one without: the profile name.
    assert label_for(None, work, "octocat", "1", [work]) == "work"
    assert label_for(None, None, "mona", "3", [work]) == "mona"
    assert label_for("home", work, "octocat", "1", [work]) == "home"


def test_choosing_an_account() -> None:
    work = replace(grant(account="1"), account_label="work", account_name="octocat")
    work_older = replace(work, id="older", tenant="shared")
    home = replace(grant(account="2"), account_label=None, account_name=None)
    assert choose([work, work_older], None, "GitHub") == [work, work_older]  # one account (held twice): as before
    with pytest.raises(AccountChoiceNeeded) as raised:
        choose([work, home, work_older], None, "GitHub")
    assert raised.value.labels == ("work", "an unnamed account")
    assert choose([work, home], "2", "GitHub") == [home]
    assert choose([work, home], "OctoCat", "GitHub") == [work]
    assert choose([work, home], "nobody", "GitHub") == []
    with pytest.raises(FlowRefused):
        choose([work], "x" * 256, "GitHub")
    ask_new = AccountAsk("home", ("work",), new=True)
    assert AccountAsk.from_json(json.loads(json.dumps(ask_new.to_json()))) == ask_new
    assert (
        ask_new.suggested_label == "home" and AccountAsk("1", ("work",), login_hint="octocat").suggested_label is None
    )


async def test_grants_list_shows_each_accounts_label(deployment: Deployment, connector_env: dict[str, str]) -> None:
    provider = deployment.provider
    provider.account = WORK
    await ask(deployment, ["repo"], label="work")
    provider.account = PERSONAL
    await ask(deployment, ["repo"], account="personal")
    code, out, err = await asyncio.to_thread(run_cli, connector_env, "grants", "list", "--provider", "github")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[4:6] == ["ACCOUNT", "LABEL"]
    assert sorted(row.split()[4:6] for row in rows) == [["4242", "work"], ["777", "personal"]]
    code, out, _ = await asyncio.to_thread(run_cli, connector_env, "grants", "list", "--json")
    listed = sorted((g["account"], g["accountLabel"], g["accountName"]) for g in json.loads(out)["items"])
    assert listed == [("4242", "work", "octocat"), ("777", "personal", "mona-at-home")]
    for secret in provider.secrets_issued():
        assert secret not in out
