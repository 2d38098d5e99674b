"""The operator console under `/admin`: server-rendered pages (Jinja2, the connect pages' templates and CSP, no
script), behind operator authentication (`session.py`: the operator API key, or a session from the OIDC sign-in in
`login.py`; an agent's key is 403). Pages are `views.py`, actions `actions.py`; both go through `service.console`.

Every route but the sign-in's two answers 401 (or 403) without an operator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...config import Settings
from ...console import Console
from ...core.agent_api import AgentApi
from ...core.errors import FlowRefused
from ...oauth import ProviderGateway
from ...store import Store
from ...util.clock import Clock
from ...vault import Vault
from ..inputs import checked
from ..pages import Pages
from .actions import Actions
from .login import CALLBACK_PATH, OperatorLogin
from .session import Caller, OperatorAuth
from .views import Views

__all__ = ["AdminParts", "admin_base_url", "admin_routes"]

ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
Handler = Callable[[Request, Caller], Awaitable[Response]]


class AdminParts(Protocol):
    settings: Settings
    console: Console
    vault: Vault
    store: Store
    clock: Clock
    agent_api: AgentApi
    providers: ProviderGateway


def admin_base_url(settings: Settings) -> str:
    """Where operators' browsers reach the console: admin.base_url, else its own listener's address, else
    public_base_url."""
    admin = settings.admin
    if admin.base_url is not None:
        return admin.base_url.rstrip("/")
    if admin.port is not None:
        host = admin.host if admin.host not in ("0.0.0.0", "::") else "127.0.0.1"  # noqa: S104 - a comparison
        return f"http://{f'[{host}]' if ':' in host else host}:{admin.port}"
    return settings.public_base_url


def admin_routes(parts: AdminParts, pages: Pages) -> list[BaseRoute]:
    settings = parts.settings
    base_url = admin_base_url(settings)
    auth = OperatorAuth(
        settings.admin, parts.vault, parts.agent_api, parts.clock, secure=base_url.startswith("https://")
    )
    views = Views(parts.console, pages, auth, settings.admin)
    actions = Actions(parts.console, views, auth, parts.store, parts.clock)

    def operator(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await handler(request, await auth.caller(request))

        return checked(endpoint)

    routes: list[BaseRoute] = [
        Route("/admin", operator(views.overview), methods=["GET"]),
        Route("/admin/grants", operator(views.grants), methods=["GET"]),
        Route("/admin/grants/{grant_id}/revoke", operator(actions.revoke_page), methods=["GET"]),
        Route("/admin/grants/{grant_id}/revoke", operator(actions.revoke), methods=["POST"]),
        Route("/admin/elicitations", operator(views.elicitations), methods=["GET"]),
        Route("/admin/elicitations/{elicitation_id}/cancel", operator(actions.cancel_page), methods=["GET"]),
        Route("/admin/elicitations/{elicitation_id}/cancel", operator(actions.cancel), methods=["POST"]),
        Route("/admin/audit", operator(views.audit), methods=["GET"]),
        Route("/admin/audit.csv", operator(views.audit_csv), methods=["GET"]),
        Route("/admin/webhooks", operator(views.webhooks), methods=["GET"]),
        Route("/admin/webhooks/{webhook_id}", operator(views.deliveries), methods=["GET"]),
        Route("/admin/webhooks/{webhook_id}/rotate", operator(actions.rotate_page), methods=["GET"]),
        Route("/admin/webhooks/{webhook_id}/rotate", operator(actions.rotate), methods=["POST"]),
        Route("/admin/keys", operator(views.keys), methods=["GET"]),
        Route("/admin/logout", operator(actions.logout), methods=["POST"]),
    ]
    if settings.admin.oidc:
        login = OperatorLogin(settings.admin, base_url, parts.providers, parts.vault, parts.store, auth, parts.clock)
        routes += [
            Route("/admin/login", login.start, methods=["GET"]),
            Route(CALLBACK_PATH, checked(login.callback), methods=["GET"]),
        ]

    async def nothing_here(request: Request, caller: Caller) -> Response:
        raise FlowRefused("not_found")

    # Anything else under /admin: 401/403 before 404, so that a stranger learns nothing of what exists here.
    routes.append(Route("/admin/{rest:path}", operator(nothing_here), methods=ANY_METHOD))
    return routes
