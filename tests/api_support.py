"""The `/v1` API in tests: keys made the way `acp-connector api-keys create` makes them, and a client for them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import httpx

from service import Identity
from service.core.agent_api import new_api_key
from service.store import Store


async def make_key(store: Store, tenant: str = "agent-a", providers: Sequence[str] | None = None) -> str:
    key, record = new_api_key(tenant, f"Agent {tenant.upper()}", providers, datetime.now(UTC))
    await store.api_keys.insert(record)
    return key


def api_client(base_url: str, key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30)


def create_body(user: Identity, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "user": {"issuer": user.issuer, "subject": user.subject},
        "provider": "github",
        "scopes": ["repo"],
        "scope": {"sessionId": "sess-1", "toolCallId": "call-1"},
    }
    body.update(extra)
    return body


def user_headers(user: Identity) -> dict[str, str]:
    return {"Connector-User-Issuer": user.issuer, "Connector-User-Subject": user.subject}
