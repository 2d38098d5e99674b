"""The credential step of the browser flow: an API key (or an HTTP Basic pair) typed on the connector's own page.

It takes the place of the trip to the provider for a credential entry, after the same identity step: once the
browser is known to be the bound user, `BrowserFlow.start_authorization` opens a form ticket (a flow row: its
hash, the browser binding, an expiry) and sends the browser to the form. The form is shown only to that browser
with that ticket; a submission is format-checked, then proven by the entry's check request at the provider, and
only then stored (encrypted, as a grant, through the same `BrowserFlow.complete` as an OAuth grant) and the
elicitation finished. A refused, malformed or unanswered credential keeps the user on the form with a sentence
saying why, is audited (without the values), and stores nothing. Values never leave this module but to the vault
and the provider's check request.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .errors import FlowRefused, ProviderError
from .handles import binding_hash, new_id, state_hash
from .records import ElicitationRecord, FlowRecord, TokenSet
from .states import ElicitationStatus

if TYPE_CHECKING:
    from .browser import BrowserFlow

FORM_PATH = "credentials"  # the form's address: <connect url>/credentials
FORM_TTL = timedelta(minutes=10)  # how long a verified browser may take to type and submit
# The grant's account when the check request names none (or there is no check request): one grant per user.
UNNAMED_ACCOUNT = "unnamed"


@dataclass(frozen=True, slots=True)
class FieldView:
    """One value the form asks for (never its value)."""

    name: str
    label: str
    help: str
    docs_url: str


@dataclass(frozen=True, slots=True)
class CredentialForm:
    """What the credential page shows of a credential entry."""

    provider: str  # the display name
    kind: str  # "api_key" or "basic"
    fields: tuple[FieldView, ...]
    api_host: str  # the one host the values are sent to
    revoke_url: str | None


@dataclass(frozen=True, slots=True)
class CredentialVerdict:
    """What the provider's check request said: the account it names, or its refusal in words."""

    account_id: str | None = None
    refusal: str | None = None  # e.g. "OpenAI refused this key: invalid_api_key"


@dataclass(frozen=True, slots=True)
class Submitted:
    """How one submission ended: the completed (or cancelled) elicitation, or why the user must try again."""

    record: ElicitationRecord | None
    problems: Mapping[str, str] = field(default_factory=dict)  # field name ("" for the whole form) -> sentence
    hint: str = ""  # what may be shown of what was stored (last four characters)

    @property
    def stored(self) -> bool:
        return self.record is not None


def credential_message(form: CredentialForm) -> str:
    """What an elicitation for a credential entry says, unless the agent wrote its own message."""
    asked = " and ".join(field.label for field in form.fields)
    return f"Enter your {form.provider} {asked} on the connector's page; it is sent only to {form.api_host}."


def form_url(connect_url: str, ticket: str) -> str:
    return f"{connect_url}/{FORM_PATH}?ticket={ticket}"


def ticket_flow(
    record: ElicitationRecord, browser_binding: str, connect_url: str, now: datetime
) -> tuple[FlowRecord, str]:
    """A form ticket for `record`, bound to this browser (the flow row stores only hashes), and the form's URL."""
    ticket = secrets.token_urlsafe(32)
    flow = FlowRecord(
        id=new_id(16),
        elicitation_id=record.id,
        state_hash=state_hash(ticket),
        verifier_key_id=None,
        verifier_ciphertext=None,
        nonce=None,
        expected_issuer=None,
        browser_binding_hash=binding_hash(browser_binding),
        redirect_uri=connect_url,
        created_at=now,
        expires_at=min(record.expires_at, now + FORM_TTL),
        used_at=None,
    )
    return flow, form_url(connect_url, ticket)


class CredentialStep:
    """The form's two requests: show it (to the verified browser holding the ticket) and take a submission."""

    def __init__(self, flow: BrowserFlow) -> None:
        self.flow = flow
        self.providers = flow.providers
        self.elicitations = flow.elicitations

    async def form(
        self, elicitation_id: str, ticket: str | None, browser_binding: str | None
    ) -> tuple[ElicitationRecord, CredentialForm]:
        """The elicitation and its form, for the browser the ticket was issued to (FlowRefused otherwise)."""
        record, _ = await self._ticket(elicitation_id, ticket, browser_binding)
        form = self.providers.credential_form(record.provider)
        if form is None:
            raise FlowRefused("unknown_elicitation")
        return record, form

    async def submit(
        self, elicitation_id: str, ticket: str | None, browser_binding: str | None, values: Mapping[str, str]
    ) -> Submitted:
        """Check what was typed (format, then the provider's check request) and store it; or say why not."""
        record, flow = await self._ticket(elicitation_id, ticket, browser_binding)
        typed = {name: value.strip() for name, value in values.items()}
        problems = self.providers.credential_problems(record.provider, typed)
        if problems:
            await self.elicitations.audit(record, "credential_malformed", detail={"fields": sorted(problems)})
            return Submitted(None, problems)
        provider = await self.flow.resolve(record.provider)
        try:
            verdict = await self.providers.check_credential(provider, typed)
        except ProviderError as exc:
            await self.elicitations.audit(record, "credential_unchecked", detail={"error": exc.code})
            sentence = (
                f"{provider.display_name} did not answer the check in time. Nothing was stored; try again."
                if exc.code == "provider_timeout"
                else f"{provider.display_name} could not check it right now ({exc.code}). Nothing was stored."
            )
            return Submitted(None, {"": sentence})
        if verdict.refusal is not None:
            await self.elicitations.audit(record, "credential_refused")
            return Submitted(None, {"": verdict.refusal})
        claimed = await self.flow.store.flows.claim(flow.state_hash, self.flow.now())
        if claimed is None:  # submitted twice at once, or the ticket ran out meanwhile
            raise FlowRefused("credential_form_used")
        kind = self.providers.entry_kind(record.provider)
        tokens = TokenSet.of_credential(kind, typed, now=self.flow.now().timestamp())
        account = verdict.account_id or UNNAMED_ACCOUNT
        completed = await self.flow.complete(record, provider, tokens, account)
        return Submitted(completed, hint=self.providers.credential_hint(record.provider, typed))

    async def _ticket(
        self, elicitation_id: str, ticket: str | None, browser_binding: str | None
    ) -> tuple[ElicitationRecord, FlowRecord]:
        """The elicitation and the ticket's flow, if this browser holds a live ticket for it."""
        if not ticket or len(ticket) > 128:
            raise FlowRefused("credential_form_invalid")
        found = await self.flow.store.flows.get_with_elicitation(state_hash(ticket))
        if found is None or found[0].elicitation_id != elicitation_id:
            await self.elicitations.record_unattributed("unknown_state", elicitation_id=elicitation_id)
            raise FlowRefused("credential_form_invalid")
        flow, record, _ = found
        record = await self.flow.usable(record)
        if browser_binding is None or binding_hash(browser_binding) != flow.browser_binding_hash:
            await self.elicitations.audit(record, "browser_mismatch")
            raise FlowRefused("browser_mismatch")
        if flow.used_at is not None:
            raise FlowRefused("credential_form_used")
        if flow.expires_at <= self.flow.now() or record.status is not ElicitationStatus.AUTHORIZING:
            raise FlowRefused("credential_form_expired")
        return record, flow
