"""The quirks that bend the spec most, each shown end to end against a mock emulating the provider: the grant
stored and used as the provider needs, and a bad answer refused clearly (`provider_token_error` naming the provider
and the field; no grant stored, nothing secret shown).

Slack's user token under `authed_user`; GitHub's errors with HTTP 200 on the code exchange and on refresh;
Salesforce's `instance_url` as the API base; Microsoft's `{tenant}`; a Shopify shop's `{subdomain}` given by the
agent; QuickBooks' `realmId` from the callback; LinkedIn, which issues no refresh token (outside its partner
program); Notion's revocation, which needs its Notion-Version header.
"""

from __future__ import annotations

import html
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from service.core.errors import FlowRefused, GrantNeedsUser
from service.core.scopes import SessionScope

from .provider_lab import USER, ProviderLab, provider_lab

pytestmark = pytest.mark.asyncio(loop_scope="module")

NAMES = ["slack", "github", "salesforce", "microsoft", "shopify", "quickbooks", "linkedin", "notion"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProviderLab]:
    async with provider_lab(Path(tmp_path_factory.mktemp("quirks")), NAMES) as running:
        yield running


async def grants_at(lab: ProviderLab, name: str) -> list[dict[str, Any]]:
    async with lab.api() as api:
        answer = await api.get("/v1/grants", params={"issuer": USER.issuer, "subject": USER.subject, "provider": name})
    assert answer.status_code == 200, answer.text
    grants: list[dict[str, Any]] = answer.json()["grants"]
    return grants


async def disconnect_all(lab: ProviderLab, name: str) -> None:
    for grant in await grants_at(lab, name):
        assert (await lab.disconnect(grant["grantId"])).status_code == 204


async def refused_clearly(lab: ProviderLab, name: str, field: str, **connect: Any) -> str:
    """Connect while the mock answers badly: the page and the elicitation say provider_token_error (or the
    callback's error), naming the provider and `field`; no grant is stored; no secret of the mock is shown."""
    await disconnect_all(lab, name)
    connected = await lab.connect(name, **connect)
    assert connected.status == 502, connected.page.text
    text = html.unescape(connected.page.text)
    assert lab.mocks[name].entry.display_name or name in text
    assert field in text, text
    assert connected.state["status"] == "failed" and connected.grant is None
    assert await grants_at(lab, name) == []
    for secret in lab.mocks[name].secrets_issued():
        assert secret not in text
    reason: str = connected.state["reason"]
    return reason


def without(pointer: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A spoiler for the mock's next token answer: the member at `pointer` removed."""

    def spoil(answer: dict[str, Any]) -> dict[str, Any]:
        *path, last = pointer.strip("/").split("/")
        target = answer
        for part in path:
            target = target[part]
        del target[last]
        return answer

    return spoil


async def test_slack_user_token_under_authed_user(lab: ProviderLab) -> None:
    mock = lab.mocks["slack"]
    connected = await lab.connect("slack", scopes=["users:read", "chat:write"])
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["accountId"] == "4242"  # authed_user.id, from the token response: no account lookup
    assert grant["scopes"] == ["users:read", "chat:write"]  # authed_user.scope, comma-separated
    asked = mock.authorization_requests[-1]
    assert asked["scope"] == "users:read chat:write"  # sent as user_scope=users:read,chat:write (the mock checks)
    user_token = mock.issued_access_tokens[-1]
    assert (await lab.proxy("slack", "users.list")).status_code == 200
    assert (await lab.use("slack", "users.list")).status_code == 200
    assert mock.token_active(user_token)
    assert (await lab.disconnect(grant["grantId"])).status_code == 204  # auth.revoke with the token itself
    assert not mock.token_active(user_token)

    mock.spoil_next_token_answer = without("/authed_user/access_token")
    reason = await refused_clearly(lab, "slack", "/authed_user/access_token")
    assert reason == "provider_token_error"
    mock.token_errors = ["invalid_code"]  # Slack answers errors with HTTP 200 and ok=false
    assert await refused_clearly(lab, "slack", "error=invalid_code") == "provider_token_error"
    assert mock.token_statuses[-1] == 200


async def test_github_errors_with_200_on_code_exchange_and_refresh(lab: ProviderLab) -> None:
    mock = lab.mocks["github"]
    mock.token_errors = ["invalid_grant"]  # the mock says it as GitHub does: bad_verification_code, HTTP 200
    assert await refused_clearly(lab, "github", "error=bad_verification_code") == "provider_token_error"
    assert mock.token_statuses[-1] == 200, (mock.token_statuses, mock.token_requests)

    connected = await lab.connect("github")
    grant = connected.grant
    assert grant is not None and grant["accountId"] == "4242"
    assert (await lab.use("github", "user/repos")).status_code == 200
    mock.expire_access_tokens()
    assert (await lab.use("github", "user/repos")).status_code == 200  # refreshed: a new refresh token came
    mock.expire_access_tokens()
    mock.revoke_refresh_tokens()
    with pytest.raises(GrantNeedsUser):  # GitHub answers bad_refresh_token with HTTP 200: the user must come back
        await lab.use("github", "user/repos")
    assert mock.token_statuses[-1] == 200
    events = await lab.connector.runtime.store.audit.list(event="refresh_failed")
    assert events[-1].provider == "github" and events[-1].detail["reason"] == "provider_token_error"
    # The grant stays, marked for the user (the entry says which refresh errors mean that).
    [kept] = await grants_at(lab, "github")
    assert kept["grantId"] == grant["grantId"] and kept["status"] == "needs_user"
    assert "bad_refresh_token" in lab.entry("github").quirks.token_response.dead_refresh_token_errors
    await disconnect_all(lab, "github")


async def test_salesforce_instance_url_is_the_api_base(lab: ProviderLab) -> None:
    mock = lab.mocks["salesforce"]
    connected = await lab.connect("salesforce")
    grant = connected.grant
    assert grant is not None, connected.page.text
    instance = f"{mock.base_url}/acme.my.salesforce.com"
    assert grant["connection"] == {"instance_url": instance}
    assert (await lab.use("salesforce", "sobjects")).status_code == 200
    assert (await lab.proxy("salesforce", "limits")).status_code == 200
    assert mock.api_calls[-2:] == [
        "/acme.my.salesforce.com/services/data/v62.0/sobjects",
        "/acme.my.salesforce.com/services/data/v62.0/limits",
    ]
    mock.expire_access_tokens()
    assert (await lab.use("salesforce", "sobjects")).status_code == 200  # refreshed; the instance URL kept
    await disconnect_all(lab, "salesforce")

    def elsewhere(answer: dict[str, Any]) -> dict[str, Any]:
        return {**answer, "instance_url": "https://attacker.example.com"}

    mock.spoil_next_token_answer = elsewhere
    assert await refused_clearly(lab, "salesforce", "instance_url") == "provider_token_error"
    mock.spoil_next_token_answer = without("/instance_url")
    reason = await refused_clearly(lab, "salesforce", "/instance_url")
    assert reason == "provider_token_error"


async def test_microsoft_tenant_given_by_the_agent(lab: ProviderLab) -> None:
    mock = lab.mocks["microsoft"]
    mock.seen_values.clear()
    connected = await lab.connect("microsoft", connection={"tenant": "contoso.onmicrosoft.com"})
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["connection"] == {"tenant": "contoso.onmicrosoft.com"}
    # The authorization, the token endpoint and the signing keys were all the tenant's (the mock refuses another).
    assert mock.seen_values["tenant"] == "contoso.onmicrosoft.com"
    mock.expire_access_tokens()
    assert (await lab.use("microsoft", "v1.0/me")).status_code == 200  # refreshed at the tenant's token endpoint
    await disconnect_all(lab, "microsoft")

    refused = await lab.create("microsoft", connection={"tenant": "../evil"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_connection_value" and "tenant" in refused.text

    mock.seen_values.clear()
    mock.spoil_next_token_answer = without("/access_token")
    assert await refused_clearly(lab, "microsoft", "/access_token", connection={}) == "provider_token_error"
    assert mock.seen_values["tenant"] == "common"  # without the agent's value: the operator's default


async def test_shopify_subdomain_given_by_the_agent(lab: ProviderLab) -> None:
    mock = lab.mocks["shopify"]
    refused = await lab.create("shopify", connection={})
    assert refused.status_code == 400
    body = refused.json()["error"]
    assert body["code"] == "missing_connection_value" and "subdomain" in body["message"]
    with pytest.raises(FlowRefused) as embedded:  # the embedded API refuses before anything is asked
        await lab.connector.request_authorization(
            None, user=USER, provider="shopify", scope=SessionScope("sess-1"), connection={}
        )
    assert embedded.value.code == "missing_connection_value" and embedded.value.detail["name"] == "subdomain"

    mock.seen_values.clear()
    connected = await lab.connect("shopify", connection={"subdomain": "acme"})
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["connection"] == {"subdomain": "acme"} and grant["accountId"] == "4242"
    assert (await lab.proxy("shopify", "products.json")).status_code == 200  # X-Shopify-Access-Token (checked)
    assert (await lab.use("shopify", "orders.json")).status_code == 200
    assert mock.api_calls[-2:] == [
        "/acme.myshopify.com/admin/api/2025-01/products.json",
        "/acme.myshopify.com/admin/api/2025-01/orders.json",
    ]
    # Expiring offline tokens (required of public apps from 2027-01-01): the code exchange sent expiring=1 with the
    # client's secret in the body (the emulated Shopify refuses it otherwise), and the token is refreshed when it
    # expires, each refresh giving a new refresh token.
    assert mock.token_requests[-1] == {"grant_type": "authorization_code", "client_auth": "client_secret_post"}
    assert lab.entry("shopify").quirks.token_request.exchange_params == {"expiring": "1"}
    refresh_tokens = len(mock.issued_refresh_tokens)
    mock.expire_access_tokens()
    assert (await lab.use("shopify", "orders.json")).status_code == 200
    assert mock.token_requests[-1] == {"grant_type": "refresh_token", "client_auth": "client_secret_post"}
    assert len(mock.issued_refresh_tokens) == refresh_tokens + 1
    mock.expire_access_tokens()
    assert (await lab.use("shopify", "orders.json")).status_code == 200  # with the replaced refresh token
    token = mock.issued_access_tokens[-1]
    assert (await lab.disconnect(grant["grantId"])).status_code == 204  # DELETE api_permissions/current.json
    assert not mock.token_active(token)

    mock.spoil_next_token_answer = without("/access_token")
    reason = await refused_clearly(lab, "shopify", "/access_token", connection={"subdomain": "acme"})
    assert reason == "provider_token_error"


async def test_quickbooks_realm_id_from_the_callback(lab: ProviderLab) -> None:
    mock = lab.mocks["quickbooks"]
    connected = await lab.connect("quickbooks")
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["connection"] == {"realm_id": "9130350000000000"}
    assert (await lab.use("quickbooks", "companyinfo/1")).status_code == 200
    assert mock.api_calls[-1] == "/quickbooks.api.intuit.com/v3/company/9130350000000000/companyinfo/1"
    assert (await lab.proxy("quickbooks", "query")).status_code == 200
    await disconnect_all(lab, "quickbooks")

    mock.omit_callback_values = True
    assert await refused_clearly(lab, "quickbooks", "realmId") == "provider_callback_error"


async def test_linkedin_issues_no_refresh_token(lab: ProviderLab) -> None:
    mock = lab.mocks["linkedin"]
    connected = await lab.connect("linkedin")
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["expiresAt"] is not None and grant["needsUserAgain"] is False
    assert (await lab.use("linkedin", "v2/userinfo")).status_code == 200
    mock.expire_access_tokens()
    assert (await lab.use("linkedin", "v2/userinfo")).status_code == 401  # nothing to refresh with
    assert not any(request["grant_type"] == "refresh_token" for request in mock.token_requests)
    assert not mock.issued_refresh_tokens
    await disconnect_all(lab, "linkedin")

    mock.spoil_next_token_answer = without("/access_token")
    assert await refused_clearly(lab, "linkedin", "/access_token") == "provider_token_error"


async def test_notion_revocation_carries_its_version_header(lab: ProviderLab) -> None:
    mock = lab.mocks["notion"]
    connected = await lab.connect("notion")
    grant = connected.grant
    assert grant is not None, connected.page.text
    assert grant["accountId"] == "4242"  # owner.user.id of the token response
    assert mock.token_requests[-1]["client_auth"] == "client_secret_basic"  # JSON body, Basic auth (checked)
    token = mock.issued_access_tokens[-1]
    assert (await lab.disconnect(grant["grantId"])).status_code == 204  # POST /v1/oauth/revoke with Notion-Version
    assert mock.revocation_requests[-1]["client_auth"] == "basic"
    assert not mock.token_active(token)

    mock.spoil_next_token_answer = without("/owner/user/id")
    assert await refused_clearly(lab, "notion", "/owner/user/id") == "provider_token_error"
