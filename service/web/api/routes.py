"""`/v1` elicitations and grants: the handlers, each declared once as an `Operation` (route and OpenAPI)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from service.core.agent_api import AgentApi, Created
from service.core.answers import AnswerKind, ClientAnswer
from service.core.errors import FlowRefused, VaultError
from service.core.outcomes import AuthorizationOutcome, GrantInfo, StopCause
from service.core.records import ApiElicitationRecord, ApiKeyRecord, ElicitationRecord, GrantRecord
from service.core.scopes import ElicitationScope, RequestScope, SessionScope
from service.tokens import TokenAccess, unreadable_error

from ..inputs import invalid
from . import models
from .io import answer, caller, identity_of, query_text, read_model

_ANSWERS = {
    "accept": AnswerKind.ACCEPT,
    "decline": AnswerKind.DECLINE,
    "cancel": AnswerKind.CANCEL,
    "client_error": AnswerKind.ERROR,
    "disconnected": AnswerKind.DISCONNECTED,
}

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "path" | "query" | "header"
    description: str
    required: bool = False
    schema: dict[str, object] = field(default_factory=lambda: {"type": "string"})


@dataclass(frozen=True)
class Operation:
    """One route of the API and what the OpenAPI document says of it."""

    method: str
    path: str
    endpoint: Endpoint
    summary: str
    body: type[BaseModel] | None = None
    body_required: bool = True  # False: the body may be left out (its model's defaults apply)
    responses: dict[int, type[BaseModel] | None] = field(default_factory=dict)
    errors: Sequence[str] = ()
    params: Sequence[Param] = ()
    streaming: str | None = None  # the media type of a streamed answer (proxy, events)
    stream_model: type[BaseModel] | None = None  # what each streamed item is (an event's `data`)


def grant_model(
    grant: GrantRecord,
    display_name: str | None = None,
    now: datetime | None = None,
    connection: dict[str, str] | None = None,
) -> models.Grant:
    """What an agent is told of a grant; `connection`: its per-connection values that may be shown."""
    info = GrantInfo.of(grant, now)
    return models.Grant(
        grant_id=grant.id,
        provider=grant.provider,
        account_id=grant.provider_account_id,
        account_label=grant.account_label,
        account_name=grant.account_name,
        scopes=list(grant.scopes),
        created_at=grant.created_at,
        updated_at=grant.updated_at,
        expires_at=grant.token_expires_at,
        needs_user_again=grant.needs_user_again,
        status=info.status,
        reason=info.reason,
        reason_text=info.describe_health(display_name),
        last_refresh_at=info.last_refresh_at,
        last_failure_at=info.last_failure_at,
        next_refresh_at=info.next_refresh_at,
        connection=connection or {},
    )


class ElicitationRoutes:
    def __init__(
        self, api: AgentApi, tokens: TokenAccess, providers: Sequence[str], *, max_body: int, max_wait: float
    ) -> None:
        self.api = api
        self.providers = tuple(providers)
        self.tokens = tokens
        self.max_body = max_body
        self.max_wait = max_wait

    async def state(
        self, record: ElicitationRecord, owner: ApiElicitationRecord, outcome: AuthorizationOutcome | None = None
    ) -> models.ElicitationState:
        if outcome is None and record.status.terminal:
            outcome = await self.api.elicitations.outcome(record)
        grant = None
        if outcome is not None and outcome.grant is not None:
            stored = await self.api.store.grants.get(outcome.grant.id)
            grant = self.grant_model(stored) if stored is not None else None
        return models.ElicitationState(
            elicitation_id=record.id,
            status=record.status,
            outcome=outcome.status if outcome is not None else None,
            reason=record.failure_reason,
            provider=record.provider,
            provider_display_name=self.api.elicitations.display_name(record.provider),
            scopes=list(record.scopes),
            url=self.api.elicitations.connect_url(record.id),
            message=record.message,
            session_id=record.session_id,
            tool_call_id=record.tool_call_id,
            request_id=record.request_id,
            connection_id=owner.connection_id,
            answered=owner.answered_at is not None,
            created_at=record.created_at,
            expires_at=record.expires_at,
            grant=grant,
            refused_scopes=list(outcome.refused_scopes) if outcome is not None else [],
        )

    # -- handlers -----------------------------------------------------------------------------------------
    async def create(self, request: Request) -> Response:
        key = await caller(request, self.api)
        body = await read_model(request, models.CreateElicitation, self.max_body)
        idempotency_key = request.headers.get("idempotency-key")
        if idempotency_key is not None and not re.fullmatch(r"[\x21-\x7e]{1,255}", idempotency_key):
            raise invalid("the Idempotency-Key header must be 1-255 visible ASCII characters")
        scope: ElicitationScope = (
            SessionScope(body.scope.session_id, body.scope.tool_call_id)
            if body.scope.session_id is not None
            else RequestScope(body.scope.request_id)  # type: ignore[arg-type]  # the model checked one is set
        )
        created = await self.api.create(
            key,
            user=identity_of(body.user.issuer, body.user.subject, where="'user'"),
            provider=body.provider,
            scopes=body.scopes,
            scope=scope,
            message=body.message,
            idempotency_key=idempotency_key,
            connection_id=body.connection_id,
            ask_again=body.ask_again,
            grants_only=body.grants_only,
            url_mode=body.url_mode,
            connection=body.connection,
            account=body.account,
        )
        status = 200 if created.replayed or created.elicitation is None else 201
        return answer(await self._created(created, body.provider), status)

    async def _created(self, created: Created, provider: str) -> models.Created:
        display_name = self.api.elicitations.display_name(provider)
        if created.grant is not None:
            return models.Created(
                status="narrowed" if created.refused_scopes else "already_authorized",
                provider_display_name=display_name,
                grant=self.grant_model(created.grant),
                refused_scopes=list(created.refused_scopes),
            )
        if created.elicitation is None or created.owner is None:
            status = "unsupported" if created.unsupported else "needs_user"
            return models.Created(status=status, provider_display_name=display_name)
        state = await self.state(created.elicitation, created.owner)
        return models.Created(
            status="created",
            provider_display_name=state.provider_display_name,
            elicitation_id=state.elicitation_id,
            url=state.url,
            message=state.message,
            expires_at=state.expires_at,
            elicitation=state,
        )

    async def get(self, request: Request) -> Response:
        key = await caller(request, self.api)
        elicitation_id = request.path_params["elicitation_id"]
        wait = query_text(request, "wait")
        if wait is None:
            record, owner = await self.api.find(key, elicitation_id)
        else:
            try:
                seconds = float(wait)
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds <= self.max_wait:
                raise invalid(f"the query parameter 'wait' must be between 0 and {self.max_wait:g} seconds")
            record, owner = await self.api.wait(key, elicitation_id, seconds)
        return answer(await self.state(record, owner))

    async def answer(self, request: Request) -> Response:
        key = await caller(request, self.api)
        elicitation_id = request.path_params["elicitation_id"]
        body = await read_model(request, models.Answer, self.max_body)
        kind = _ANSWERS[body.action]
        if kind is AnswerKind.CANCEL:  # the client's reason: sanitised where the answer is recorded
            reported = ClientAnswer(kind, client_message=body.message)
        else:
            message = body.message if body.message and body.message.isprintable() else None
            reported = ClientAnswer(kind, error_code=body.code, message=message)
        record, owner, outcome = await self.api.answer(key, elicitation_id, reported)
        return answer(await self.state(record, owner, outcome))

    async def cancel(self, request: Request) -> Response:
        key = await caller(request, self.api)
        elicitation_id = request.path_params["elicitation_id"]
        body = await read_model(request, models.Cancel, self.max_body, optional=True)
        record, owner = await self.api.cancel(
            key, elicitation_id, StopCause(body.cause), request_cancelled=body.request_cancelled
        )
        return answer(await self.state(record, owner))

    async def grants(self, request: Request) -> Response:
        key = await caller(request, self.api)
        user = identity_of(
            query_text(request, "issuer", required=True),
            query_text(request, "subject", required=True),
            where="send the user as the query parameters 'issuer' and 'subject'",
        )
        provider = query_text(request, "provider")
        if provider is not None:
            self.api.check_provider(key, provider)
            names = [provider]
        else:
            names = [name for name in self.providers if key.allows(name)]
        found: list[GrantRecord] = []
        seen = self.api.tenants_seen(key)
        for name in names:
            found.extend(await self.api.store.grants.find(user, name, tenants=seen))
        return answer(models.GrantList(grants=[self.grant_model(g) for g in found]))

    def grant_model(self, grant: GrantRecord) -> models.Grant:
        elicitations = self.api.elicitations
        try:
            connection = self.tokens.shown_connection(grant)
        except VaultError:  # the operator's to fix (its use is 503 grant_unreadable): listed without those values
            unreadable_error(grant, self.tokens.vault)
            connection = {}
        return grant_model(grant, elicitations.display_name(grant.provider), elicitations.now(), connection)

    async def delete_grant(self, request: Request) -> Response:
        key = await caller(request, self.api)
        grant = await self.visible_grant(key, request.path_params["grant_id"])
        await self.tokens.disconnect_grant(grant)
        return Response(status_code=204)

    async def visible_grant(self, key: ApiKeyRecord, grant_id: str) -> GrantRecord:
        grant = await self.api.store.grants.get(grant_id)
        # Another tenant's grant (not shared with this one) is as unknown as a grant that never was.
        if grant is None or not key.allows(grant.provider) or grant.tenant not in self.api.tenants_seen(key):
            raise FlowRefused("unknown_grant")
        return grant

    def operations(self) -> list[Operation]:
        auth_errors = ("unauthorized",)
        body_errors = ("bad_request", "invalid_input", "body_too_large", "unsupported_media_type")
        eid = Param("elicitation_id", "path", "The elicitation's id.", required=True)
        return [
            Operation(
                "POST",
                "/v1/elicitations",
                self.create,
                "Create an elicitation (or learn that a grant already covers the scopes)",
                body=models.CreateElicitation,
                responses={201: models.Created, 200: models.Created},
                errors=(
                    *auth_errors,
                    *body_errors,
                    "provider_not_allowed",
                    "unknown_provider",
                    "provider_not_configured",
                    "idempotency_conflict",
                    "account_choice_needed",
                    "invalid_account",
                ),
                params=(
                    Param(
                        "Idempotency-Key",
                        "header",
                        "Repeating a request with the same key answers with the same elicitation.",
                    ),
                ),
            ),
            Operation(
                "GET",
                "/v1/elicitations/{elicitation_id}",
                self.get,
                "An elicitation's state; with ?wait=SECONDS, held until it ends or the time is up",
                responses={200: models.ElicitationState},
                errors=(*auth_errors, "unknown_elicitation", "invalid_input"),
                params=(
                    eid,
                    Param(
                        "wait",
                        "query",
                        f"Seconds to wait for the elicitation to end (0-{self.max_wait:g}).",
                        schema={"type": "number", "minimum": 0, "maximum": self.max_wait},
                    ),
                ),
            ),
            Operation(
                "POST",
                "/v1/elicitations/{elicitation_id}/answer",
                self.answer,
                "Report how the client answered elicitation/create (once)",
                body=models.Answer,
                responses={200: models.ElicitationState},
                errors=(*auth_errors, *body_errors, "unknown_elicitation", "already_answered"),
                params=(eid,),
            ),
            Operation(
                "POST",
                "/v1/elicitations/{elicitation_id}/cancel",
                self.cancel,
                "Cancel an open elicitation (the agent's work no longer needs it), saying why (optional)",
                body=models.Cancel,
                body_required=False,
                responses={200: models.ElicitationState},
                errors=(*auth_errors, *body_errors, "unknown_elicitation", "already_ended"),
                params=(eid,),
            ),
            Operation(
                "GET",
                "/v1/grants",
                self.grants,
                "A user's grants held by this key's tenant, or shared with it (metadata only, never a token)",
                responses={200: models.GrantList},
                errors=(*auth_errors, "invalid_input", "provider_not_allowed", "unknown_provider"),
                params=(
                    Param("issuer", "query", "The user's identity issuer.", required=True),
                    Param("subject", "query", "The user's subject at that issuer.", required=True),
                    Param("provider", "query", "Only grants at this provider."),
                ),
            ),
            Operation(
                "DELETE",
                "/v1/grants/{grant_id}",
                self.delete_grant,
                "Revoke one of this tenant's grants at the provider (where it supports revocation), then delete it",
                responses={204: None},
                errors=(*auth_errors, "unknown_grant"),
                params=(Param("grant_id", "path", "The grant's id.", required=True),),
            ),
        ]
