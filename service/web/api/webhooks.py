"""`/v1/webhooks`: an API key's agent registers, lists and removes its signed-webhook endpoints, rotates their
signing secrets, and reads how deliveries stand. A secret is in the answer that creates it (registering, rotating),
and nowhere else."""

from __future__ import annotations

from datetime import timedelta

from starlette.requests import Request
from starlette.responses import Response

from service.core.agent_api import AgentApi
from service.core.errors import FlowRefused
from service.core.records import ApiKeyRecord, WebhookDeliveryRecord, WebhookEndpointRecord
from service.core.webhooks import WebhookEndpoints

from ..inputs import invalid
from . import models
from .io import answer, caller, query_text, read_model
from .routes import Operation, Param

MAX_LISTED_DELIVERIES = 100


def webhook_model(endpoint: WebhookEndpointRecord) -> models.Webhook:
    return models.Webhook(
        webhook_id=endpoint.id, url=endpoint.url, description=endpoint.description, created_at=endpoint.created_at
    )


def delivery_model(delivery: WebhookDeliveryRecord) -> models.WebhookDelivery:
    return models.WebhookDelivery(
        delivery_id=delivery.id,
        event_id=delivery.event_id,
        elicitation_id=delivery.elicitation_id,
        status=delivery.status,
        attempts=delivery.attempts,
        next_attempt_at=delivery.next_attempt_at,
        last_attempt_at=delivery.last_attempt_at,
        last_status_code=delivery.last_status_code,
        last_error=delivery.last_error,
        created_at=delivery.created_at,
        delivered_at=delivery.delivered_at,
    )


class WebhookRoutes:
    def __init__(self, api: AgentApi, webhooks: WebhookEndpoints, *, max_body: int) -> None:
        self.api = api
        self.webhooks = webhooks
        self.max_body = max_body

    async def create(self, request: Request) -> Response:
        key = await caller(request, self.api)
        body = await read_model(request, models.CreateWebhook, self.max_body)
        try:
            endpoint, secret = await self.webhooks.create(key.tenant, body.url, body.description)
        except ValueError as exc:
            raise FlowRefused("webhook_url_refused", detail={"problem": str(exc)}) from None
        except LookupError:
            raise FlowRefused("webhook_limit") from None
        await self._audit("webhook_created", endpoint, key)
        created = models.WebhookCreated(**webhook_model(endpoint).model_dump(), secret=secret)
        return answer(created, 201)

    async def rotate_secret(self, request: Request) -> Response:
        key = await caller(request, self.api)
        body = await read_model(request, models.RotateWebhookSecret, self.max_body, optional=True)
        endpoint = await self._own(key, request.path_params["webhook_id"])
        try:
            rotated, secret = await self.webhooks.rotate_secret(endpoint, timedelta(seconds=body.overlap_seconds))
        except LookupError:
            raise FlowRefused("unknown_webhook") from None  # deleted meanwhile
        await self._audit("webhook_secret_rotated", rotated, key, overlap_seconds=body.overlap_seconds)
        made = models.WebhookSecretRotated(
            **webhook_model(rotated).model_dump(),
            secret=secret,
            previous_secret_expires_at=rotated.previous_secret_expires_at,
        )
        return answer(made)

    async def listed(self, request: Request) -> Response:
        key = await caller(request, self.api)
        endpoints = await self.webhooks.repo.endpoints(key.tenant)
        return answer(models.WebhookList(webhooks=[webhook_model(e) for e in endpoints]))

    async def delete(self, request: Request) -> Response:
        key = await caller(request, self.api)
        endpoint = await self._own(key, request.path_params["webhook_id"])
        if await self.webhooks.repo.delete_endpoint(endpoint.id):
            await self._audit("webhook_deleted", endpoint, key)
        return Response(status_code=204)

    async def deliveries(self, request: Request) -> Response:
        key = await caller(request, self.api)
        endpoint = await self._own(key, request.path_params["webhook_id"])
        given = query_text(request, "limit") or "20"
        if not given.isdigit() or not 1 <= int(given) <= MAX_LISTED_DELIVERIES:
            raise invalid(f"the query parameter 'limit' must be between 1 and {MAX_LISTED_DELIVERIES}")
        found = await self.webhooks.repo.deliveries(endpoint.id, limit=int(given))
        return answer(models.WebhookDeliveryList(deliveries=[delivery_model(d) for d in found]))

    async def _own(self, key: ApiKeyRecord, webhook_id: str) -> WebhookEndpointRecord:
        endpoint = await self.webhooks.repo.endpoint(webhook_id)
        if endpoint is None or endpoint.tenant != key.tenant:
            raise FlowRefused("unknown_webhook")
        return endpoint

    async def _audit(self, event: str, endpoint: WebhookEndpointRecord, key: ApiKeyRecord, **more: int) -> None:
        detail = {"webhook_id": endpoint.id, "tenant": endpoint.tenant, "via": "api", "key_id": key.id, **more}
        await self.api.store.audit.record(event, detail=detail, now=self.api.now())

    def operations(self) -> list[Operation]:
        auth = ("unauthorized",)
        body_errors = ("bad_request", "invalid_input", "body_too_large", "unsupported_media_type")
        wid = Param("webhook_id", "path", "The webhook endpoint's id.", required=True)
        return [
            Operation(
                "POST",
                "/v1/webhooks",
                self.create,
                "Register a webhook endpoint for this key's agent (the answer holds its secret, shown once)",
                body=models.CreateWebhook,
                responses={201: models.WebhookCreated},
                errors=(*auth, *body_errors, "webhook_url_refused", "webhook_limit"),
            ),
            Operation(
                "GET",
                "/v1/webhooks",
                self.listed,
                "This key's agent's webhook endpoints (never their secrets)",
                responses={200: models.WebhookList},
                errors=auth,
            ),
            Operation(
                "DELETE",
                "/v1/webhooks/{webhook_id}",
                self.delete,
                "Remove a webhook endpoint, with its deliveries (nothing more is sent to it)",
                responses={204: None},
                errors=(*auth, "unknown_webhook"),
                params=(wid,),
            ),
            Operation(
                "POST",
                "/v1/webhooks/{webhook_id}/secret",
                self.rotate_secret,
                "Rotate an endpoint's signing secret (the answer holds the new one, shown once); the previous one "
                "keeps signing alongside it for the overlap (optional body)",
                body=models.RotateWebhookSecret,
                body_required=False,
                responses={200: models.WebhookSecretRotated},
                errors=(*auth, *body_errors, "unknown_webhook"),
                params=(wid,),
            ),
            Operation(
                "GET",
                "/v1/webhooks/{webhook_id}/deliveries",
                self.deliveries,
                "An endpoint's newest deliveries: status, attempts, the last answer's status code or error",
                responses={200: models.WebhookDeliveryList},
                errors=(*auth, "unknown_webhook", "invalid_input"),
                params=(
                    wid,
                    Param(
                        "limit",
                        "query",
                        f"How many (1-{MAX_LISTED_DELIVERIES}, default 20).",
                        schema={"type": "integer", "minimum": 1, "maximum": MAX_LISTED_DELIVERIES},
                    ),
                ),
            ),
        ]
