"""The ASGI app: routes, middleware and error pages. Built per connector by `create_app`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import SchemaNotCurrent
from .browser import BrowserRoutes
from .identity_routes import IdentityRoutes
from .pages import Pages
from .ratelimit import RateLimit, RateLimiter, RateLimitGuard
from .security import SecurityHeaders

if TYPE_CHECKING:
    from ..connector import Connector

log = logging.getLogger("service.web")

STATIC = Path(__file__).parent / "static"


def create_app(connector: Connector) -> Starlette:
    pages = Pages()
    browser = BrowserRoutes(connector, pages)
    store = connector.runtime.store

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            await store.ping()
            await store.check_schema()
        except SchemaNotCurrent as exc:
            return JSONResponse({"status": "unready", "code": exc.code, "message": str(exc)}, status_code=503)
        except Exception as exc:
            log.warning("readiness check failed: %s", type(exc).__name__)
            return JSONResponse(
                {
                    "status": "unready",
                    "code": "database_unreachable",
                    "message": "the database cannot be reached",
                },
                status_code=503,
            )
        return JSONResponse({"status": "ready"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {404: "Not found", 405: "Method not allowed"}
        return pages.message(
            request,
            exc.status_code,
            titles.get(exc.status_code, "Error"),
            "There is nothing at this address.",
            code="not_found" if exc.status_code == 404 else f"http_{exc.status_code}",
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
        return pages.message(
            request,
            500,
            "Something went wrong",
            "The connector hit an internal error. Try the link again.",
            code="internal_error",
        )

    routes = [
        Route("/connect/{elicitation_id}", browser.connect_page, methods=["GET"]),
        Route("/connect/{elicitation_id}", browser.connect_submit, methods=["POST"]),
        Route("/connect", browser.connect_page, methods=["GET"]),
        Route("/callback/{provider}", browser.callback, methods=["GET"]),
        *IdentityRoutes(browser).routes(),  # the configured verifier's return routes and confirm endpoint
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    https = connector.settings.public_base_url.startswith("https://")
    # Handlers that learn the elicitation only from a request body use it through `request.app.state.rate_limits`.
    rate_limits = RateLimitGuard(
        RateLimiter(connector.settings.rate_limit),
        trusted_proxies=connector.settings.server.trusted_proxies,
        audit=store.audit,
        pages=pages,
        now=connector.runtime.now,
    )
    app = Starlette(
        routes=routes,
        # Outermost first: every answer, a 429 included, gets the security headers.
        middleware=[Middleware(SecurityHeaders, https=https), Middleware(RateLimit, guard=rate_limits)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    app.state.rate_limits = rate_limits
    return app
