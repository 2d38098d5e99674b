"""`/`: what this service is, and on a loopback deployment its version, its providers and how to try one.

In demo mode (`demo = true`, loopback and the local verifier only) `/demo/start` plays the agent: it creates an
authorization request for the local user, consents to it as a client would, and sends the browser to its connect
page, so a newcomer can click through a whole flow without an agent or an editor.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..config import Settings
from ..core.errors import FlowRefused
from ..core.identity import Identity
from ..core.lifecycle import Elicitations
from ..core.scopes import RequestScope
from ..core.urls import is_loopback_host
from ..oauth import ProviderGateway
from ..version import __version__
from .pages import Pages

DEMO_CONNECTION = "demo"  # the connection key of demo requests: no ACP client listens for their completion


class Home:
    def __init__(
        self,
        pages: Pages,
        settings: Settings,
        providers: ProviderGateway,
        elicitations: Elicitations,
        demo_user: Identity | None,
    ) -> None:
        self.pages = pages
        self.settings = settings
        self.providers = providers
        self.elicitations = elicitations
        self.demo_user = demo_user  # None: no demo

    async def page(self, request: Request) -> Response:
        # A public deployment says what it is and nothing about its version or setup.
        private = self.settings.is_loopback_deployment
        entries = self.providers.catalog.entries() if private else []
        configured = [entry for entry in entries if entry.configured and not entry.is_credential]
        # API-key and Basic-credential entries: ready without set-up (the user types the key on our page).
        credentials = [entry for entry in entries if entry.is_credential and entry.configured]
        return self.pages.render(
            request,
            "home.html",
            {
                "title": "ACP OAuth connector",
                "version": __version__ if private else None,
                "configured": configured,
                # Only when every ready provider signs in on this machine (the demo's mock) is nothing sent elsewhere.
                "all_local": bool(configured)
                and all(is_loopback_host(entry.provider_host or "") for entry in configured),
                "unconfigured": [entry for entry in entries if not entry.configured],
                "credentials": credentials,
                "local_credentials": [e for e in credentials if is_loopback_host(e.provider_host or "")],
                "demo": self.demo_user is not None,
                "demo_user": self.demo_user.subject if self.demo_user is not None else None,
            },
        )

    async def demo_start(self, request: Request) -> Response:
        """Start an authorization for the demo user at `?provider=` (default: the first configured one)."""
        user = self.demo_user
        if user is None:
            raise FlowRefused("not_found")
        entries = self.providers.catalog.entries()
        configured = [entry.name for entry in entries if entry.configured]
        oauth = [entry.name for entry in entries if entry.configured and not entry.is_credential]
        name = request.query_params.get("provider") or (oauth[0] if oauth else "")
        if name not in configured:
            raise FlowRefused("provider_not_configured", detail={"message": _not_configured(name)})
        entry = self.providers.entry(name)
        record = await self.elicitations.create(
            connection_key=DEMO_CONNECTION,
            user=user,
            provider=name,
            scopes=entry.default_scopes,
            scope=RequestScope(f"demo-{secrets.token_hex(4)}"),
            message=f"Demo: connect your {entry.shown_name} account (no agent is waiting for this one)."
            if not entry.is_credential
            else f"Demo: enter your {entry.shown_name} API key (no agent is waiting for this one).",
        )
        await self.elicitations.consented(record)  # the demo plays the client that accepted
        return RedirectResponse(f"/connect/{record.id}", status_code=303)


def _not_configured(name: str) -> str:
    return f"There is no provider called “{name}” ready on this connector." if name else "No provider is ready yet."
