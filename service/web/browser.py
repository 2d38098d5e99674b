"""Browser routes: the consent page, its Continue/Decline form, and the provider callback."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..flow import BrowserFlow, FlowError
from ..states import ElicitationStatus
from .pages import Pages
from .security import BrowserBinding, csp_with_form_target, csrf_token, csrf_valid

if TYPE_CHECKING:
    from ..connector import Connector


class BrowserRoutes:
    def __init__(self, connector: Connector, pages: Pages) -> None:
        self.connector = connector
        self.flow = BrowserFlow(connector.runtime)
        self.pages = pages
        self.binding = BrowserBinding(secure=connector.settings.public_base_url.startswith("https://"))

    async def connect_page(self, request: Request) -> Response:
        elicitation_id = request.path_params.get("elicitation_id") or request.query_params.get("elicitationId", "")
        try:
            view = await self.flow.consent_view(elicitation_id)
        except FlowError as exc:
            return self.pages.error(request, exc)
        binding, is_new = self.binding.ensure(request)
        entry = view.provider
        auth_host = entry.provider_host or ""
        response = self.pages.render(
            request,
            "consent.html",
            {
                "agent_name": view.agent_name,
                "provider": entry.display_name,
                "provider_host": auth_host,
                "scopes": view.elicitation.scopes,
                "message": view.elicitation.message,
                "action": f"/connect/{view.elicitation.id}",
                "csrf": csrf_token(self.connector.runtime.vault, view.elicitation.id, binding),
            },
        )
        if entry.authorization_endpoint:
            parts = urlsplit(entry.authorization_endpoint)
            response.headers["Content-Security-Policy"] = csp_with_form_target(f"{parts.scheme}://{parts.netloc}")
        if is_new:
            self.binding.set(response, binding)
        return response

    async def connect_submit(self, request: Request) -> Response:
        elicitation_id = request.path_params["elicitation_id"]
        form = await request.form()
        binding = self.binding.read(request)
        token = form.get("csrf")
        if not csrf_valid(
            self.connector.runtime.vault, elicitation_id, binding, token if isinstance(token, str) else None
        ):
            return self.pages.error(
                request,
                FlowError(
                    403,
                    "csrf_failed",
                    "Form expired",
                    "This form could not be verified. Reload the link from the agent and try again.",
                ),
            )
        assert binding is not None
        action = form.get("action")
        try:
            if action == "decline":
                await self.flow.decline(elicitation_id)
                return self.pages.message(
                    request, 200, "Declined", "You declined. Nothing was shared and you can close this tab."
                )
            if action != "continue":
                raise FlowError(400, "bad_action", "Invalid request", "Choose Continue or Decline.")
            user = await self.connector.verifier.identify()
            url = await self.flow.start_authorization(elicitation_id, user, binding)
        except FlowError as exc:
            return self.pages.error(request, exc)
        return RedirectResponse(url, status_code=303)

    async def callback(self, request: Request) -> Response:
        provider = request.path_params["provider"]
        params = {k: v for k, v in request.query_params.items()}
        try:
            record = await self.flow.callback(provider, params, self.binding.read(request))
        except FlowError as exc:
            return self.pages.error(request, exc)
        entry = self.connector.runtime.catalog.get(provider)
        if record.status is ElicitationStatus.CANCELLED:
            return self.pages.message(
                request,
                200,
                "Connected",
                f"Your {entry.display_name} account is connected, but the agent had already cancelled the "
                "request that asked for it. You can close this tab.",
            )
        return self.pages.message(
            request,
            200,
            "Connected",
            f"Your {entry.display_name} account is connected. You can close this tab and return to the agent.",
        )
