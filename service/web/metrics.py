"""`/metrics`: the Prometheus exposition, behind the optional bearer token, on the public or its own listener."""

from __future__ import annotations

import hmac

from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config import Settings
from ..core.errors import FlowRefused
from ..metrics import Metrics
from .kit import api_error

PATH = "/metrics"


def metrics_route(metrics: Metrics, token: SecretStr | None) -> Route:
    expected = None if token is None else token.get_secret_value().encode()

    async def endpoint(request: Request) -> Response:
        if expected is not None:
            scheme, _, supplied = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(supplied.strip().encode(), expected):
                return api_error(FlowRefused("metrics_unauthorized"))
        body, content_type = await metrics.render()
        return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})

    return Route(PATH, endpoint, methods=["GET"])


def on_public_listener(settings: Settings) -> bool:
    """Whether the public app serves `/metrics`: with a token, or on a loopback deployment; never with its own port."""
    config = settings.metrics
    if not config.enabled or config.port is not None:
        return False
    return config.bearer_token is not None or settings.is_loopback_deployment


def metrics_app(metrics: Metrics, settings: Settings) -> Starlette:
    """The app of the separate metrics listener (`metrics.host`:`metrics.port`)."""
    return Starlette(routes=[metrics_route(metrics, settings.metrics.bearer_token)])
