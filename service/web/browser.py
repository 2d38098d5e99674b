"""Browser routes: the consent page, its Continue/Decline form, and the provider callback."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..core.accounts import LABEL_MAX_LENGTH, clean_label
from ..core.browser import BrowserFlow
from ..core.errors import FlowRefused
from ..core.identity import Identity
from ..core.states import ElicitationStatus
from ..core.urls import host_of, origin
from ..core.verification import IdentityStep
from ..providers.entry import NAME_RE as PROVIDER_NAME_RE
from ..util.hosts import HostAssessment, assess_host
from ..vault import Vault
from .errors import describe
from .inputs import read_form
from .kit import browser_facts
from .label_cookie import LabelCookie
from .pages import Pages
from .result import (
    FAILURE_TICKET,
    Failure,
    FailureCookie,
    Result,
    ResultCookie,
    done_path,
    failed_path,
    new_failure_ticket,
)
from .security import BrowserBinding, csp_with_form_target, csrf_token, csrf_valid


class BrowserRoutes:
    def __init__(
        self,
        flow: BrowserFlow,
        identity: IdentityStep,
        pages: Pages,
        binding: BrowserBinding,
        vault: Vault,
        *,
        public_host: str,
        trusted_proxies: Sequence[str],
    ) -> None:
        self.flow = flow
        self.identity = identity
        self.pages = pages
        self.binding = binding
        self.vault = vault
        self.result = ResultCookie(vault, secure=binding.secure)
        self.labels = LabelCookie(vault, secure=binding.secure)
        self.failure = FailureCookie(vault, secure=binding.secure)
        self.public_host = public_host
        self.trusted_proxies = tuple(trusted_proxies)

    async def connect_page(self, request: Request) -> Response:
        elicitation_id = request.path_params.get("elicitation_id") or request.query_params.get("elicitationId", "")
        view = await self.flow.consent_view(elicitation_id)
        binding, is_new = self.binding.ensure(request)
        provider = view.provider
        sign_in_host = provider.sign_in_host
        assessed = assess_host(sign_in_host)
        # Continue redirects to the identity verifier's sign-in first (oidc, confirm) or straight to the provider.
        verifier_targets = await self.identity.verifier.form_targets()
        credential = self.flow.providers.credential_form(provider.name)
        response = self.pages.render(
            request,
            "consent.html",
            {
                "agent_name": view.agent_name,
                "provider": provider.display_name,
                "provider_host": _ascii_host(sign_in_host),
                "provider_host_unicode": assessed.unicode_host if assessed.punycode else None,
                "host_warnings": host_warnings(
                    [("sign-in address", assessed), ("this page's address", assess_host(self.public_host))]
                ),
                "identity_hosts": [host_of(target) for target in verifier_targets],
                "scopes": [(scope, provider.describe_scope(scope)) for scope in view.elicitation.scopes],
                "message": view.elicitation.message,
                "bound_to": identity_hint(view.elicitation.identity),
                "expires": expiry_words(view.elicitation.expires_at, self.flow.now()),
                "action": f"/connect/{view.elicitation.id}",
                "csrf": csrf_token(self.vault, view.elicitation.id, binding),
                "credential": credential,
                "accounts": view.account.held if view.account is not None else (),
                "label": view.account.suggested_label if view.account is not None else None,
                "label_max": LABEL_MAX_LENGTH,
            },
        )
        # Continue goes on to the provider, or (a credential entry) to this connector's own form.
        provider_target = [] if credential is not None else [origin(provider.authorization_endpoint)]
        targets = [*verifier_targets, *provider_target]
        response.headers["Content-Security-Policy"] = csp_with_form_target(" ".join(dict.fromkeys(targets)))
        if is_new:
            self.binding.set(response, binding)
        return response

    async def connect_submit(self, request: Request) -> Response:
        elicitation_id = request.path_params["elicitation_id"]
        form = await read_form(request)
        binding = self.binding.read(request)
        if not csrf_valid(self.vault, elicitation_id, binding, form.get("csrf")):
            # The id may be forged: it is recorded as given, and nothing about the elicitation changes.
            await self.flow.elicitations.record_unattributed("csrf_failed", elicitation_id=elicitation_id)
            raise FlowRefused("csrf_failed")
        assert binding is not None
        action = form.get("action")
        browser = browser_facts(request, self.trusted_proxies)
        if action == "decline":
            # Like Continue, only once the identity step knows the browser is the bound user.
            first = await self.identity.decline(elicitation_id, binding, browser)
            if first is not None:
                return RedirectResponse(first, status_code=303)
            return self.pages.message(
                request, 200, "Declined", "You declined. Nothing was shared and you can close this tab."
            )
        if action != "continue":
            raise FlowRefused("bad_action")
        label = clean_label(form.get("account_label"))  # refused before anything changes
        url = await self.identity.begin(elicitation_id, binding, browser)
        response = RedirectResponse(url, status_code=303)
        self.labels.set(response, elicitation_id, binding, label)
        return response

    async def callback(self, request: Request) -> Response:
        provider = request.path_params["provider"]
        params = {k: v for k, v in request.query_params.items()}
        binding = self.binding.read(request)
        try:
            connected = await self.flow.callback(
                provider, params, binding, lambda elicitation_id: self.labels.read(request, elicitation_id, binding)
            )
        except FlowRefused as exc:
            return self._refused_callback(request, provider, binding, exc)
        assert binding is not None  # the flow refuses a callback from a browser without its binding
        elicitation_id = connected.elicitation.id
        # Off the provider's redirect (its code and state) to an address with nothing in it; the cookie says the rest.
        response = RedirectResponse(done_path(elicitation_id), status_code=303)
        self.labels.clear(response, elicitation_id)
        cancelled = connected.elicitation.status is ElicitationStatus.CANCELLED
        self.result.set(
            response, elicitation_id, binding, Result(connected.display_name, connected.account_label, cancelled)
        )
        return response

    def _refused_callback(self, request: Request, provider: str, binding: str | None, exc: FlowRefused) -> Response:
        """The refusal's page, but at a clean address: the provider's code and state leave the address bar too."""
        refusal, text = describe(exc)
        if not PROVIDER_NAME_RE.match(provider):
            return self.pages.error(request, exc)  # no provider's callback: no page of its own to send the browser to
        ticket = new_failure_ticket()
        response = RedirectResponse(failed_path(provider, ticket), status_code=303)
        request_id = request.scope.get("state", {}).get("request_id")
        failure = Failure(refusal.status, refusal.title, text, exc.code, refusal.outcome, request_id)
        self.failure.set(response, provider, ticket, binding, failure)
        return response

    async def failed_page(self, request: Request) -> Response:
        """Where a refused callback sends the browser: the refusal, with its status, told once."""
        provider, ticket = request.path_params["provider"], request.path_params["ticket"]
        failure = None
        if FAILURE_TICKET.fullmatch(ticket):
            failure = self.failure.read(request, provider, ticket, self.binding.read(request))
        if failure is None:
            return self._nothing_here(request)
        page = self.pages.message(
            request,
            failure.status,
            failure.title,
            failure.text,
            failure.code,
            outcome=failure.outcome,
            request_id=failure.request_id,
        )
        self.failure.clear(page, provider, ticket)
        return page

    def _nothing_here(self, request: Request) -> Response:
        """A page told once, asked again (a reload), or reached without the cookie."""
        return self.pages.message(
            request, 200, "Nothing to do here", "There is nothing more to do here. You can close this tab."
        )

    async def done_page(self, request: Request) -> Response:
        """Where the callback sends the browser: what happened, told once (the cookie is taken)."""
        elicitation_id = request.path_params["elicitation_id"]
        result = self.result.read(request, elicitation_id, self.binding.read(request))
        if result is None:
            return self._nothing_here(request)
        page = self.pages.message(request, 200, "Connected", connected_sentence(result))
        self.result.clear(page, elicitation_id)
        return page


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


def connected_sentence(result: Result) -> str:
    account = f"Your {result.display_name} account"
    if result.account_label is not None:
        account += f" {result.account_label}"
    if result.agent_cancelled:
        return (
            f"{account} is connected, but the agent had already cancelled the request that asked for it. "
            "You can close this tab."
        )
    return f"{account} is connected. You can close this tab and return to the agent."


def identity_hint(identity: Identity) -> str:
    """Which account a link is for, recognisable by its owner without naming it to whoever else holds the link:
    the subject's first characters (and an address's domain), and where it signs in."""
    name, at, domain = identity.subject.partition("@")
    shown = f"{name[:2]}…" if len(name) > 4 else f"{name[:1]}…"
    where = host_of(identity.issuer) or identity.issuer
    return f"{shown}{at}{domain} at {where}"


def expiry_words(expires_at: datetime, now: datetime) -> str:
    """When a link stops working, as a person reads it: "22:45 UTC (in 10 minutes)"."""
    minutes = max(0, round((expires_at - now).total_seconds() / 60))
    left = "less than a minute" if minutes == 0 else f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{expires_at.astimezone(UTC):%H:%M} UTC (in {left})"
