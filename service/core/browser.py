"""The browser side of an elicitation: open, decline, send to the provider, take the callback.

Each step checks the elicitation's state through the store's atomic transitions, records an audit event, and
raises `FlowRefused` (a stable code) when the browser must be refused; `service.web` renders it."""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from .accounts import UNNAMED, LabelOf, Named, clean_label, label_for, no_label
from .callback_checks import claim_for_callback
from .consent import Connected, ConsentView
from .credentials import ticket_flow
from .errors import ConnectorError, FlowRefused, ProviderError
from .events import GrantEvent
from .handles import binding_hash, flow_aad, grant_aad, new_id, state_hash
from .identity import Identity
from .lifecycle import Elicitations, Written
from .ports import Provider, ProviderGateway, Store, Tx, Vault
from .records import OFFLINE_ACCESS, AuditEntry, ElicitationRecord, FlowRecord, GrantRecord, Intent, TokenSet
from .renewal import store_given
from .settings import FlowSettings
from .states import RESTART_FROM, START_FROM, ElicitationStatus

log = logging.getLogger("service.flow")

# How long the browser may spend at the provider before the state is no longer accepted.
FLOW_TTL = timedelta(minutes=10)
SHOWN_KEPT = 256  # elicitations of consent pages shown here, kept for their Continue (`shown_elicitation`)
_ERROR_CODE = re.compile(r"[a-z0-9_.-]{1,64}")

AUTHORIZING = ElicitationStatus.AUTHORIZING
# The refusal for an elicitation that has ended, by how it ended.
CLOSED_CODES: dict[ElicitationStatus, str] = {
    ElicitationStatus.COMPLETED: "already_completed",
    ElicitationStatus.DECLINED: "declined",
    ElicitationStatus.CANCELLED: "cancelled",
    ElicitationStatus.EXPIRED: "expired",
    ElicitationStatus.FAILED: "failed",
}


class BrowserFlow:
    def __init__(
        self, elicitations: Elicitations, store: Store, vault: Vault, providers: ProviderGateway, settings: FlowSettings
    ) -> None:
        self.elicitations = elicitations
        self.store = store
        self.vault = vault
        self.providers = providers
        self.settings = settings
        self._shown: OrderedDict[str, ElicitationRecord] = OrderedDict()

    def now(self) -> datetime:
        return self.elicitations.now()

    # -- shared checks ---------------------------------------------------------------------------------
    async def open_elicitation(self, elicitation_id: str, *, allow_cancelled: bool = False) -> ElicitationRecord:
        """The elicitation if the browser may still act on it; expires it lazily when its time is up.

        `allow_cancelled`: the callback may finish a flow the agent cancelled meanwhile (the grant is stored,
        nothing resumes); every other step refuses a cancelled elicitation.
        """
        record = await self.elicitations.get(elicitation_id)
        if record is None:
            raise FlowRefused("unknown_elicitation")
        return await self.usable(record, allow_cancelled=allow_cancelled)

    async def usable(self, record: ElicitationRecord, *, allow_cancelled: bool = False) -> ElicitationRecord:
        """`open_elicitation` for a record already read."""
        record = await self.elicitations.expire_if_due(record)
        if record.status.terminal and not (allow_cancelled and record.status is ElicitationStatus.CANCELLED):
            raise FlowRefused(CLOSED_CODES[record.status])
        return record

    async def resolve(self, name: str, connection: Mapping[str, str] | None = None) -> Provider:
        """The provider, its URLs filled with the elicitation's per-connection values (`connection`)."""
        try:
            provider = await self.providers.resolve(name)
            return self.providers.bind(provider, connection) if connection else provider
        except ConnectorError as exc:
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None

    # -- steps -----------------------------------------------------------------------------------------
    async def consent_view(self, elicitation_id: str) -> ConsentView:
        # `opened` is audited with the read where the database can (an open elicitation's page is shown then).
        now = self.now()
        opened = AuditEntry("opened", now, elicitation_id, None, None, None)
        found = await self.store.elicitations.get_audited(elicitation_id, opened, now=now)
        if found is None:
            raise FlowRefused("unknown_elicitation")
        record = await self.usable(found[0])
        provider = await self.resolve(record.provider, record.connection_values)
        if not found[1]:
            await self.elicitations.audit(record, "opened", now=now)
        self._shown[record.id] = record
        if len(self._shown) > SHOWN_KEPT:
            self._shown.popitem(last=False)
        return ConsentView(record, provider, record.agent_name, record.account)

    async def shown_elicitation(self, elicitation_id: str) -> ElicitationRecord:
        """The elicitation as this process's consent page read it (unexpired), else `open_elicitation`: only its status
        may have changed since, and `_start`'s conditional UPDATE decides by that (the Continue reads nothing)."""
        record = self._shown.pop(elicitation_id, None)
        if record is None or record.expires_at <= self.now():
            return await self.open_elicitation(elicitation_id)
        return record

    async def decline(self, record: ElicitationRecord, browser_user: Identity) -> None:
        """The browser's verified user declines: only the bound user can (FlowRefused `not_your_link` otherwise).

        `record` is the elicitation as just read by `open_elicitation`."""
        await self.check_identity(record, browser_user, Intent.DECLINE)
        await self.elicitations.finish(
            record, ElicitationStatus.DECLINED, "declined", reason="declined on the consent page"
        )

    async def start_authorization(self, record: ElicitationRecord, browser_user: Identity, browser_binding: str) -> str:
        """Check the browser's verified user against the bound one, then build the provider redirect.

        `record` is the elicitation as just read by `open_elicitation`: the one conditional UPDATE below is what
        decides whether it may still start."""
        await self.check_identity(record, browser_user)
        if self.providers.credential_form(record.provider) is not None:  # an API key: to our own form instead
            ticket, form = ticket_flow(record, browser_binding, self.settings.connect_url(record.id), self.now())
            await self._start(record, ticket)
            return form
        provider = await self.resolve(record.provider, record.connection_values)
        redirect_uri = self.settings.callback_url(provider.name)
        try:
            request = await self.providers.authorization_request(
                provider, redirect_uri=redirect_uri, scopes=record.scopes, account=record.account
            )
        except ConnectorError as exc:  # a pushed authorization request (PAR) refused or failed
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        now = self.now()
        flow_id = new_id(16)
        verifier_key_id: str | None = None
        verifier_blob: bytes | None = None
        if request.code_verifier is not None:
            verifier_key_id, verifier_blob = self.vault.encrypt(request.code_verifier.encode(), aad=flow_aad(flow_id))
        flow = FlowRecord(
            id=flow_id,
            elicitation_id=record.id,
            state_hash=state_hash(request.state),
            verifier_key_id=verifier_key_id,
            verifier_ciphertext=verifier_blob,
            nonce=request.nonce,
            expected_issuer=request.expected_issuer,
            browser_binding_hash=binding_hash(browser_binding),
            redirect_uri=redirect_uri,
            created_at=now,
            expires_at=min(record.expires_at, now + FLOW_TTL),
            used_at=None,
        )
        await self._start(record, flow)
        return request.url

    async def _start(self, record: ElicitationRecord, flow: FlowRecord) -> None:
        """The verified browser's flow begins: -> AUTHORIZING, the flow stored, `verified` audited, together."""
        store, now = self.store, flow.created_at
        verified = self.elicitations.entry(record, "verified", None, now)
        async with store.transaction() as tx:
            # -> VERIFIED -> AUTHORIZING as one UPDATE, audited in it, with the flow. A first start has no flow to
            # supersede; a restart (back button, second click) supersedes the earlier flow.
            to_start = {"now": now, "conn": tx, "audit": verified}
            if not await store.elicitations.transition(
                record.id, AUTHORIZING, from_=START_FROM, flow=flow, last=True, **to_start
            ):
                if not await store.elicitations.transition(record.id, AUTHORIZING, from_=RESTART_FROM, **to_start):
                    current = await store.elicitations.get(record.id, conn=tx)  # `record` may be as the page read it
                    raise FlowRefused(CLOSED_CODES.get((current or record).status, "failed"))
                await store.flows.invalidate_open(record.id, now, conn=tx)
                await store.flows.insert(flow, conn=tx)

    def _whose_browser(self, browser_user: Identity) -> dict[str, str]:
        """What an audit row of a refused browser says about who was there, and who vouched for it."""
        return {
            "identity_verifier": self.settings.verifier_name,
            "browser_issuer": browser_user.issuer,
            "browser_subject": browser_user.subject,
        }

    async def check_identity(
        self, record: ElicitationRecord, browser_user: Identity, intent: Intent = Intent.CONTINUE
    ) -> None:
        """The browser's verified user must be the bound user. A mismatch is counted and audited (the page
        says nothing about whom), the elicitation stays open for the rightful user, and the mismatch that
        reaches `max_mismatches` fails it as locked. Raises FlowRefused `identity_mismatch` on any mismatch.

        For a Decline a mismatch is audited (`decline_refused`) but not counted: someone else's attempt to
        decline never ends the elicitation. Raises FlowRefused `not_your_link` then."""
        if browser_user == record.identity:
            return
        store, now = self.store, self.now()
        if intent is Intent.DECLINE:
            await self.elicitations.audit(
                record,
                "decline_refused",
                detail=self._whose_browser(browser_user),
                now=now,
            )
            raise FlowRefused("not_your_link")
        limit = self.settings.max_mismatches
        async with store.transaction() as tx:
            count = await store.elicitations.add_identity_mismatch(record.id, now=now, conn=tx)
            await self.elicitations.audit(
                record,
                "identity_mismatch",
                detail={
                    **self._whose_browser(browser_user),
                    "mismatches": count,
                    "max_mismatches": limit,
                },
                now=now,
                conn=tx,
            )
        if count >= limit:
            await self.elicitations.finish(
                record,
                ElicitationStatus.FAILED,
                "identity_locked",
                reason=f"locked after {count} identity mismatches",
                detail={"mismatches": count},
            )
        raise FlowRefused("identity_mismatch")

    async def callback(
        self, provider_name: str, params: Mapping[str, str], browser_binding: str | None, label: LabelOf = no_label
    ) -> Connected:
        """Check and finish the provider's redirect; on success the grant is stored and the elicitation completed,
        with the account label this browser gave on the consent page (`label(elicitation_id)`)."""
        state = params.get("state")
        if not state:
            raise FlowRefused("missing_state")
        claimed, record, grant_held = await claim_for_callback(self, provider_name, state, browser_binding)
        provider = await self.resolve(provider_name, record.connection_values)
        await self._check_issuer(provider, claimed, params, record)  # raises
        if "error" in params:
            await self._provider_refused(record, params)
        code = params.get("code")
        if not code:
            await self.elicitations.finish(
                record, ElicitationStatus.FAILED, "provider_error", reason="no authorization code"
            )
            raise FlowRefused("missing_code")
        verifier = None
        if claimed.verifier_ciphertext is not None and claimed.verifier_key_id is not None:
            verifier = self.vault.decrypt(
                claimed.verifier_key_id, claimed.verifier_ciphertext, aad=flow_aad(claimed.id)
            ).decode()
        try:
            authorized = await self.providers.redeem(
                provider,
                redirect_uri=claimed.redirect_uri,
                code=code,
                code_verifier=verifier,
                expected_issuer=claimed.expected_issuer,
                nonce=claimed.nonce,
                now=self.now(),
                issued_after=claimed.created_at,
                callback=params,
            )
        except ProviderError as exc:
            check = exc.check
            await self.elicitations.finish(
                record,
                ElicitationStatus.FAILED,
                "provider_error",
                reason=exc.code if check is None else f"{exc.code}: {check}",
                detail={"error": exc.code, **({"check": check} if check is not None else {})},
            )
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        named = Named(clean_label(label(record.id)), authorized.account_label)
        completed = await self.complete(
            record, provider, authorized.tokens, authorized.account_id, named, held=grant_held
        )
        return Connected(completed, provider.display_name, named.shown)

    # -- helpers ---------------------------------------------------------------------------------------
    async def _check_issuer(
        self, provider: Provider, flow: FlowRecord, params: Mapping[str, str], record: ElicitationRecord
    ) -> None:
        """RFC 9207: when the provider sends `iss` (or promises to), it must be the issuer we expected.

        Checked before the code is used, so a code from a mixed-up provider never reaches a token endpoint.
        The flow is spent; the elicitation stays open, so its user can start again from the connect page.
        """
        received = params.get("iss")
        if self.providers.issuer_acceptable(provider, flow.expected_issuer, received):
            return
        log.warning("issuer mismatch on callback", extra={"elicitation_id": record.id})
        await self.elicitations.audit(
            record, "issuer_mismatch", detail={"iss": "missing" if received is None else "unexpected"}
        )
        raise FlowRefused("issuer_mismatch")

    async def _provider_refused(self, record: ElicitationRecord, params: Mapping[str, str]) -> None:
        # RFC 6749 error codes are short ASCII words; anything else is shown and stored as a placeholder.
        raw = params.get("error", "")
        error = raw if _ERROR_CODE.fullmatch(raw) else "unrecognised_error"
        declined = error == "access_denied"
        await self.elicitations.finish(
            record,
            ElicitationStatus.DECLINED if declined else ElicitationStatus.FAILED,
            "provider_error",
            reason=f"provider error: {error}",
            detail={"error": error},
        )
        raise FlowRefused("access_denied" if declined else "provider_error", detail={"error": error})

    async def complete(
        self,
        record: ElicitationRecord,
        provider: Provider,
        tokens: TokenSet,
        account_id: str,
        named: Named = UNNAMED,
        *,
        held: bool = True,
    ) -> ElicitationRecord:
        """Store the tokens (or a typed credential) as `account_id`'s grant, `named` as the user and the provider
        name it (`service.core.accounts`), and complete the elicitation, together. `held`: whether the user may hold
        a grant at the provider (False: none a moment ago, `store_given`)."""
        now = self.now()
        aad = grant_aad(record.identity.issuer, record.identity.subject, provider.name, account_id)
        key_id, blob = self.vault.encrypt_json(tokens.to_json(), aad=aad)
        # Without a `scope` in the token response the grant is what was asked (RFC 6749 §5.1).
        granted = tokens.scopes if tokens.scopes is not None else record.scopes
        refused = tuple(scope for scope in record.scopes if scope not in granted)
        grant = GrantRecord(
            id=new_id(16),
            identity=record.identity,
            provider=provider.name,
            provider_account_id=account_id,
            scopes=granted,
            token_key_id=key_id,
            token_ciphertext=blob,
            token_expires_at=_expiry(tokens),
            created_at=now,
            updated_at=now,
            refused_scopes=refused,
            tenant=record.tenant,  # the asking tenant's (docs/sidecar.md, "Tenants and grants")
            account_label=label_for(named.given, None, named.profile, account_id, ()),  # a first account's
            account_name=named.profile,
        )

        def written(stored: GrantRecord, refreshable: bool, logged: Sequence[GrantEvent] = ()) -> Written:
            if not refreshable and OFFLINE_ACCESS in record.scopes:
                log.warning(
                    "grant stored without a refresh token although offline_access was asked: it will need the user "
                    "again when its access token expires (%s)",
                    stored.token_expires_at.isoformat() if stored.token_expires_at is not None else "no expiry given",
                    extra={"elicitation_id": record.id, "provider": provider.name},
                )
            detail = {
                "grant_id": stored.id,
                "scopes": list(stored.scopes),
                **({"refused_scopes": list(refused)} if refused else {}),
                "refreshable": refreshable,
            }
            return Written(detail=detail, grant=stored, logged=logged)

        async def store_grant(tx: Tx) -> Written:  # the user may hold one there: read, and replaced if so
            given = await store_given(
                self.store, self.vault, grant, tokens, held=True, now=now, conn=tx, label=named.given
            )
            return written(given.stored, given.refreshable, given.logged)

        # A user's first grant at the provider goes in with the completion, `store_grant` only when the account has
        # one by now. The agent may have cancelled while the user was at the provider. The user did authorize, so the
        # grant is kept (written either way), but the cancelled elicitation stays cancelled and resumes nothing.
        completed = await self.elicitations.finish(
            record,
            ElicitationStatus.COMPLETED,
            "completed",
            close_flows=False,
            within=store_grant,
            late_event="completed_after_cancel",
            first_grant=None if held else (grant, written(grant, tokens.refresh_token is not None)),
        )
        if completed is None:
            return await self.elicitations.get(record.id) or record
        return completed


def _expiry(tokens: TokenSet) -> datetime | None:
    return datetime.fromtimestamp(tokens.expires_at, UTC) if tokens.expires_at is not None else None
