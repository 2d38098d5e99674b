"""The operator console in tests: a deployment with `/admin` on, seeded with a grant, an elicitation, a webhook
endpoint and audit rows, and the console's routes (every one must refuse strangers and agents)."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from service.core.records import GrantRecord, WebhookEndpointRecord

from .api_support import api_client, create_body, make_key
from .conftest import Deploy, Deployment
from .sidecar_support import seed_grant

OPERATOR_KEY = "op-" + secrets.token_urlsafe(32)
ACCESS_TOKEN = "gho_console_secret_access_token_value"

ADMIN_ENV = {
    "CONNECTOR_ADMIN__ENABLED": "true",
    "CONNECTOR_ADMIN__API_KEY": OPERATOR_KEY,
    "CONNECTOR_WEBHOOKS__ALLOW_PRIVATE_ADDRESSES": "true",
    "CONNECTOR_WEBHOOKS__DELIVER": "false",
}

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Seeded:
    deployment: Deployment
    grant: GrantRecord
    elicitation_id: str
    endpoint: WebhookEndpointRecord
    webhook_secret: str
    agent_key: str

    @property
    def base_url(self) -> str:
        return self.deployment.base_url

    def operator(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {OPERATOR_KEY}"}, timeout=30
        )

    def routes(self) -> list[tuple[str, str]]:
        """Every console route with this deployment's ids filled in (method, path)."""
        g, e, w = self.grant.id, self.elicitation_id, self.endpoint.id
        return [
            ("GET", "/admin"),
            ("GET", "/admin/grants"),
            ("GET", f"/admin/grants/{g}/revoke"),
            ("POST", f"/admin/grants/{g}/revoke"),
            ("GET", "/admin/elicitations"),
            ("GET", f"/admin/elicitations/{e}/cancel"),
            ("POST", f"/admin/elicitations/{e}/cancel"),
            ("GET", "/admin/audit"),
            ("GET", "/admin/audit.csv"),
            ("GET", "/admin/webhooks"),
            ("GET", f"/admin/webhooks/{w}"),
            ("GET", f"/admin/webhooks/{w}/rotate"),
            ("POST", f"/admin/webhooks/{w}/rotate"),
            ("GET", "/admin/keys"),
            ("POST", "/admin/logout"),
            ("GET", "/admin/"),
            ("GET", "/admin/no-such-page"),
            ("DELETE", f"/admin/grants/{g}"),
            ("GET", "/admin/login"),  # no sign-in configured here: nothing, and a stranger is told no more
            ("GET", "/admin/logout"),
        ]


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, html
    return found.group(1)


@asynccontextmanager
async def seeded_console(deploy_with: Deploy, **overrides: str) -> AsyncIterator[Seeded]:
    async with deploy_with(**{**ADMIN_ENV, **overrides}) as deployment:
        runtime = deployment.connector.runtime
        store = runtime.store
        grant = await seed_grant(
            store,
            deployment.connector.settings.environment()["CONNECTOR_VAULT__KEYS"],
            deployment.local_user,
            "github",
            ACCESS_TOKEN,
        )
        agent_key = await make_key(store, "agent-a")
        async with api_client(deployment.base_url, agent_key) as api:
            created = await api.post("/v1/elicitations", json=create_body(deployment.local_user))
            assert created.status_code == 201, created.text
        endpoint, secret = await runtime.webhooks.create("agent-a", "http://127.0.0.1:9/hook", "console test")
        yield Seeded(deployment, grant, created.json()["elicitationId"], endpoint, secret, agent_key)
