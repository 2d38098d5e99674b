"""The credential form: `GET /connect/{id}/credentials` shows it to the verified browser holding the ticket,
`POST` takes what was typed. Password fields, no autocomplete, nothing typed ever echoed back; the post carries the
consent page's CSRF binding and the ticket; the page's CSP, `no-store` and framing headers are those of every page."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

from ..core.credentials import CredentialForm, CredentialStep, Submitted
from ..core.errors import FlowRefused
from ..core.records import ElicitationRecord
from ..core.states import ElicitationStatus
from ..vault import Vault
from .inputs import CREDENTIAL_FORM_FIELDS, MAX_CREDENTIAL_FORM_BODY, read_form
from .pages import Pages
from .security import BrowserBinding, csrf_token, csrf_valid


class CredentialRoutes:
    def __init__(self, step: CredentialStep, pages: Pages, binding: BrowserBinding, vault: Vault) -> None:
        self.step = step
        self.pages = pages
        self.binding = binding
        self.vault = vault

    async def form_page(self, request: Request) -> Response:
        elicitation_id = request.path_params["elicitation_id"]
        ticket = request.query_params.get("ticket")
        binding = self.binding.read(request)
        record, form = await self.step.form(elicitation_id, ticket, binding)
        assert binding is not None  # the ticket's browser binding matched
        return self._render(request, record, form, binding, ticket or "", {}, 200)

    async def form_submit(self, request: Request) -> Response:
        elicitation_id = request.path_params["elicitation_id"]
        form = await read_form(request, CREDENTIAL_FORM_FIELDS, MAX_CREDENTIAL_FORM_BODY)
        binding = self.binding.read(request)
        if not csrf_valid(self.vault, elicitation_id, binding, form.get("csrf")):
            await self.step.elicitations.record_unattributed("csrf_failed", elicitation_id=elicitation_id)
            raise FlowRefused("csrf_failed")
        assert binding is not None
        ticket = form.get("ticket", "")
        record, view = await self.step.form(elicitation_id, ticket, binding)
        values = {field.name: form.get(field.name, "") for field in view.fields}
        submitted = await self.step.submit(elicitation_id, ticket, binding, values)
        if not submitted.stored:
            return self._render(request, record, view, binding, ticket, submitted.problems, 400)
        return self._connected(request, view, submitted)

    def _render(
        self,
        request: Request,
        record: ElicitationRecord,
        form: CredentialForm,
        binding: str,
        ticket: str,
        problems: Mapping[str, str],
        status: int,
    ) -> Response:
        return self.pages.render(
            request,
            "credentials.html",
            {
                "provider": form.provider,
                "agent_name": record.agent_name,
                "message": record.message,
                "fields": form.fields,
                "api_host": form.api_host,
                "problems": problems,
                "problem": problems.get(""),
                "action": f"/connect/{record.id}/credentials",
                "csrf": csrf_token(self.vault, record.id, binding),
                "ticket": ticket,
                "noun": _noun(form),
            },
            status_code=status,
        )

    def _connected(self, request: Request, form: CredentialForm, submitted: Submitted) -> Response:
        assert submitted.record is not None
        revoke = (
            f" It stays valid at {form.provider} until you revoke it there ({form.revoke_url})."
            if form.revoke_url
            else f" It stays valid at {form.provider} until you revoke it there."
        )
        if submitted.record.status is ElicitationStatus.CANCELLED:
            opening = f"Your {form.provider} {_noun(form)} ({submitted.hint}) is stored, but the agent had already "
            opening += "cancelled the request that asked for it."
        else:
            opening = f"Your {form.provider} {_noun(form)} ({submitted.hint}) is connected. You can close this tab "
            opening += "and return to the agent, which never sees it."
        return self.pages.message(request, 200, "Connected", opening + revoke, outcome=True)


def _noun(form: CredentialForm) -> str:
    if len(form.fields) > 1:
        return "credentials"
    return form.fields[0].label if form.fields else "key"
