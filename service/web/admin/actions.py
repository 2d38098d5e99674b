"""The console's actions: each has a page that says what it will do (GET) and a form that does it (POST) with a
CSRF token bound to the operator's session and to that action on that row, and `confirm=yes`. Each is audited with
the operator's identity by the operation itself (`service.console`)."""

from __future__ import annotations

import re
from datetime import timedelta

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ...console import Console
from ...core.errors import FlowRefused
from ...core.webhooks import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from ...store import Store
from ...util.clock import Clock
from ..inputs import CHOICE, CSRF, Rule, invalid, read_form
from .session import Caller, OperatorAuth
from .views import Views

FORM = {"csrf": CSRF, "confirm": CHOICE, "overlap": Rule(8, re.compile(r"[0-9]+"), "a number of seconds")}


class Actions:
    def __init__(self, console: Console, views: Views, auth: OperatorAuth, store: Store, clock: Clock) -> None:
        self.console = console
        self.views = views
        self.auth = auth
        self.store = store
        self.clock = clock

    async def _confirmed(self, request: Request, caller: Caller, action: str) -> dict[str, str]:
        form = await read_form(request, FORM)
        if not self.auth.csrf_valid(caller, action, form.get("csrf")):
            await self.store.audit.record(
                "csrf_failed", detail={"action": action.partition(":")[0], **caller.operator.audit()}, now=self.clock()
            )
            raise FlowRefused("operator_csrf_failed")
        if form.get("confirm") != "yes":
            raise FlowRefused("confirm_required")
        return form

    def _confirm_page(self, request: Request, caller: Caller, action: str, context: dict[str, object]) -> Response:
        return self.views.render(
            request, caller, "confirm", {"csrf": self.auth.csrf_token(caller, action), "action": action, **context}
        )

    def _done(self, request: Request, caller: Caller, title: str, text: str, back: str) -> Response:
        return self.views.render(request, caller, "done", {"title": title, "text": text, "back": back})

    # -- revoke a grant -----------------------------------------------------------------------------------
    async def revoke_page(self, request: Request, caller: Caller) -> Response:
        grant = await self.console.grant(request.path_params["grant_id"])
        return self._confirm_page(
            request,
            caller,
            f"revoke:{grant.id}",
            {
                "title": "Revoke a grant",
                "what": f"Revoke grant {grant.id} of {grant.identity.subject} at {grant.provider} "
                f"(account {grant.provider_account_id})?",
                "consequence": "The connector asks the provider to revoke its tokens (where the provider allows it) "
                "and deletes the grant. The agent can no longer act for this user at this provider until the user "
                "authorizes again.",
                "button": "Revoke",
                "back": "/admin/grants",
            },
        )

    async def revoke(self, request: Request, caller: Caller) -> Response:
        grant_id = request.path_params["grant_id"]
        await self._confirmed(request, caller, f"revoke:{grant_id}")
        done = await self.console.revoke_grant(grant_id, caller.operator)
        text = "The grant was revoked and deleted." if done else "The grant was already gone: nothing was changed."
        return self._done(request, caller, "Grant revoked" if done else "Nothing to revoke", text, "/admin/grants")

    # -- cancel an elicitation ----------------------------------------------------------------------------
    async def cancel_page(self, request: Request, caller: Caller) -> Response:
        record = await self.console.elicitation(request.path_params["elicitation_id"])
        return self._confirm_page(
            request,
            caller,
            f"cancel:{record.id}",
            {
                "title": "Cancel an elicitation",
                "what": f"Cancel elicitation {record.id} ({record.status.value}) for {record.identity.subject} at "
                f"{record.provider}?",
                "consequence": "The link stops working and the agent is told the request was cancelled.",
                "button": "Cancel the elicitation",
                "back": "/admin/elicitations",
                "ended": record.status.terminal,
            },
        )

    async def cancel(self, request: Request, caller: Caller) -> Response:
        elicitation_id = request.path_params["elicitation_id"]
        await self._confirmed(request, caller, f"cancel:{elicitation_id}")
        done = await self.console.cancel_elicitation(elicitation_id, caller.operator)
        text = "The elicitation was cancelled." if done else "The elicitation had already ended: nothing was changed."
        title = "Elicitation cancelled" if done else "Nothing to cancel"
        return self._done(request, caller, title, text, "/admin/elicitations")

    # -- rotate a webhook secret --------------------------------------------------------------------------
    async def rotate_page(self, request: Request, caller: Caller) -> Response:
        endpoint = await self.console.endpoint(request.path_params["webhook_id"])
        return self._confirm_page(
            request,
            caller,
            f"rotate:{endpoint.id}",
            {
                "title": "Rotate a webhook secret",
                "what": f"Give webhook endpoint {endpoint.id} of tenant {endpoint.tenant} ({endpoint.url}) a new "
                "signing secret?",
                "consequence": "The new secret is shown once on the next page; hand it to the receiver. The current "
                "secret keeps signing alongside it for the overlap.",
                "button": "Rotate the secret",
                "back": f"/admin/webhooks/{endpoint.id}",
                "overlap": int(DEFAULT_SECRET_OVERLAP.total_seconds()),
                "max_overlap": int(MAX_SECRET_OVERLAP.total_seconds()),
            },
        )

    async def rotate(self, request: Request, caller: Caller) -> Response:
        endpoint_id = request.path_params["webhook_id"]
        form = await self._confirmed(request, caller, f"rotate:{endpoint_id}")
        overlap = timedelta(seconds=int(form.get("overlap") or DEFAULT_SECRET_OVERLAP.total_seconds()))
        if overlap > MAX_SECRET_OVERLAP:
            raise invalid(f"the overlap is at most {int(MAX_SECRET_OVERLAP.total_seconds())} seconds")
        rotated, secret = await self.console.rotate_secret(endpoint_id, caller.operator, overlap)
        return self.views.render(
            request, caller, "rotated", {"title": "Secret rotated", "endpoint": rotated, "secret": secret}
        )

    # -- sign out -----------------------------------------------------------------------------------------
    async def logout(self, request: Request, caller: Caller) -> Response:
        form = await read_form(request, FORM)
        if not self.auth.csrf_valid(caller, "logout", form.get("csrf")):
            raise FlowRefused("operator_csrf_failed")
        await self.store.audit.record("operator_signed_out", detail=caller.operator.audit(), now=self.clock())
        response = RedirectResponse("/", status_code=303)
        self.auth.end(response)
        return response
