"""The `/v1` API for agents in any language: elicitations, grants, the token proxy, events, the OpenAPI document.

Every route authenticates an API key (`Authorization: Bearer`); errors are JSON (`{"error": {"code", "message"}}`)
with the codes of `service.web.errors`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from service.config import Settings
from service.core.agent_api import AgentApi
from service.core.webhooks import WebhookEndpoints
from service.events import LocalBus
from service.oauth import ProviderGateway
from service.tokens import TokenAccess

from ..draining import Draining
from ..inputs import checked
from . import models
from .events import EventStream
from .openapi import openapi_document
from .proxy import ProxyRoute
from .routes import ElicitationRoutes, Operation, Param
from .webhooks import WebhookRoutes

__all__ = ["ApiParts", "api_operations", "api_routes"]

PROXY_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class ApiParts(Protocol):
    """What the API is built from (the connector's `Runtime` is one)."""

    settings: Settings  # the API reads `[api]` and `public_base_url`
    agent_api: AgentApi
    tokens: TokenAccess
    providers: ProviderGateway
    bus: LocalBus
    webhooks: WebhookEndpoints


def _version() -> str:
    try:
        return version("acp-oauth-connector")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without an install
        return "0"


def api_operations(parts: ApiParts, draining: Draining) -> list[Operation]:
    names = [entry.name for entry in parts.providers.catalog.entries()]
    settings = parts.settings.api
    elicitations = ElicitationRoutes(
        parts.agent_api,
        parts.tokens,
        names,
        max_body=settings.max_body_bytes,
        max_wait=float(settings.max_wait_seconds),
    )
    proxy = ProxyRoute(parts.agent_api, parts.tokens, parts.providers, settings)
    proxy_params = (
        Param("provider", "path", "The provider's catalog name.", required=True),
        Param("path", "path", "The path under the provider's API base URL.", required=True),
        Param("Connector-User-Issuer", "header", "The user's identity issuer.", required=True),
        Param("Connector-User-Subject", "header", "The user's subject at that issuer.", required=True),
        Param(
            "Connector-Account",
            "header",
            "Which of the user's accounts at the provider: its account id or label. Required when the user holds "
            "several there (else 409 account_choice_needed, naming them).",
        ),
    )
    events = EventStream(parts.agent_api, parts.bus, draining, keepalive_seconds=settings.events_keepalive_seconds)
    webhooks = WebhookRoutes(parts.agent_api, parts.webhooks, max_body=settings.max_body_bytes)
    return [
        *elicitations.operations(),
        *webhooks.operations(),
        Operation(
            "GET",
            "/v1/events",
            events.handle,
            "Server-Sent Events: each of this key's elicitations that ends (resume with Last-Event-ID)",
            errors=("unauthorized", "invalid_input"),
            params=(
                Param(
                    "Last-Event-ID",
                    "header",
                    "Resume after this event id (as sent by the stream); without it, only new events are sent.",
                ),
                Param("after", "query", "The same as Last-Event-ID, for clients that cannot set headers."),
            ),
            streaming="text/event-stream",
            stream_model=models.Event,
        ),
        *(
            Operation(
                method,
                "/v1/proxy/{provider}/{path}",
                proxy.handle,
                "Call the provider's API with the user's token injected (the answer is the provider's)",
                errors=(
                    "unauthorized",
                    "provider_not_allowed",
                    "unknown_provider",
                    "proxy_not_available",
                    "account_choice_needed",
                    "unknown_account",
                    "invalid_account",
                    "proxy_path_refused",
                    "invalid_input",
                    "no_grant",
                    "grant_unusable",
                    "body_too_large",
                    "upstream_unavailable",
                    "upstream_timeout",
                ),
                params=proxy_params,
                streaming="*/*",
            )
            for method in PROXY_METHODS
            if method != "HEAD"
        ),
    ]


def api_routes(parts: ApiParts, draining: Draining) -> list[BaseRoute]:
    operations = api_operations(parts, draining)
    document = openapi_document(operations, version=_version(), server_url=parts.settings.public_base_url)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes: list[BaseRoute] = [Route("/v1/openapi.json", openapi, methods=["GET"])]
    by_path: dict[str, list[Operation]] = {}
    for op in operations:
        by_path.setdefault(op.path, []).append(op)
    for path, ops in by_path.items():
        if path.startswith("/v1/proxy/"):
            routes.append(Route("/v1/proxy/{rest:path}", ops[0].endpoint, methods=PROXY_METHODS))
            continue
        for op in ops:
            routes.append(Route(path, checked(op.endpoint), methods=[op.method]))
    return routes
