"""Browser routes: the consent page, its Continue/Decline form, and the provider callback."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..flow import BrowserFlow, FlowError
from ..hosts import HostAssessment, assess_host
from ..states import ElicitationStatus
from ..verification import IdentityStep
from .identity_routes import browser_facts
from .pages import Pages
from .security import BrowserBinding, csp_with_form_target, csrf_token, csrf_valid

if TYPE_CHECKING:
    from ..connector import Connector


class BrowserRoutes:
    def __init__(self, connector: Connector, pages: Pages) -> None:
        self.connector = connector
        self.flow = BrowserFlow(connector.runtime)
        self.identity = IdentityStep(connector.runtime, connector.verifier, self.flow)
        self.pages = pages
        self.binding = BrowserBinding(secure=connector.settings.public_base_url.startswith("https://"))
        self.public_host = connector.settings.public_host

    async def connect_page(self, request: Request) -> Response:
        elicitation_id = request.path_params.get("elicitation_id") or request.query_params.get("elicitationId", "")
        try:
            view = await self.flow.consent_view(elicitation_id)
        except FlowError as exc:
            return self.pages.error(request, exc)
        binding, is_new = self.binding.ensure(request)
        entry = view.provider
        auth_host = entry.provider_host or ""
        provider_host = assess_host(auth_host)
        # Continue redirects to the identity verifier's sign-in first (oidc, confirm) or straight to the provider.
        verifier_targets = await self.identity.form_targets()
        response = self.pages.render(
            request,
            "consent.html",
            {
                "agent_name": view.agent_name,
                "provider": entry.display_name,
                "provider_host": _ascii_host(auth_host),
                "provider_host_unicode": provider_host.unicode_host if provider_host.punycode else None,
                "host_warnings": host_warnings(
                    [("sign-in address", provider_host), ("this page's address", assess_host(self.public_host))]
                ),
                "identity_hosts": [urlsplit(target).hostname for target in verifier_targets],
                "scopes": view.elicitation.scopes,
                "message": view.elicitation.message,
                "action": f"/connect/{view.elicitation.id}",
                "csrf": csrf_token(self.connector.runtime.vault, view.elicitation.id, binding),
            },
        )
        targets = list(verifier_targets)
        if entry.authorization_endpoint:
            parts = urlsplit(entry.authorization_endpoint)
            targets.append(f"{parts.scheme}://{parts.netloc}")
        if targets:
            response.headers["Content-Security-Policy"] = csp_with_form_target(" ".join(dict.fromkeys(targets)))
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
            # The id may be forged: it is recorded as given, and nothing about the elicitation changes.
            await self.connector.runtime.store.audit.record(
                "csrf_failed", elicitation_id=elicitation_id[:64], now=self.connector.runtime.now()
            )
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
            url = await self.identity.begin(
                elicitation_id, binding, browser_facts(request, self.connector.settings.server.trusted_proxies)
            )
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


def _ascii_host(host: str) -> str:
    """The host as it travels on the wire: IDNA (Punycode) for international names."""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def host_warnings(hosts: list[tuple[str, HostAssessment]]) -> list[str]:
    """One sentence per host a person could misread: Punycode/international names and mixed alphabets."""
    warnings = []
    for role, host in hosts:
        if host.mixed_script:
            warnings.append(
                f"The {role} {_ascii_host(host.host)} (shown as {host.unicode_host}) mixes letters from different "
                "alphabets, a common way to imitate a well-known name. Continue only if you are sure it is right."
            )
        elif host.punycode:
            warnings.append(
                f"The {role} {_ascii_host(host.host)} (shown as {host.unicode_host}) uses international characters "
                "and may look like a different name. Continue only if you are sure it is right."
            )
    return warnings
