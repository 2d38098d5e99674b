"""The ASGI app: routes, middleware and error pages, built from the parts it serves (`WebParts`).

Every refusal the domain raises (`FlowRefused`) becomes a page here, or a JSON error on `/v1/` paths.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from ..core.browser import BrowserFlow
from ..core.credentials import CredentialStep
from ..core.errors import FlowRefused, SchemaNotCurrent
from ..core.identity import Identity
from ..core.lifecycle import Elicitations
from ..core.verification import IdentityStep
from ..identity import IdentityVerifier, VerifierRoute
from ..metrics import Metrics
from ..rate_limiter import RateLimiter
from ..store import Store, database_busy
from ..util.clock import Clock
from ..vault import Vault
from .admin import AdminParts, admin_routes
from .api import ApiParts, api_routes
from .browser import BrowserRoutes
from .client_address import ForwardedClient
from .credentials import CredentialRoutes
from .draining import Draining
from .front import Front
from .home import Home
from .inputs import InputGuard, checked
from .jwks import jwks_route
from .kit import Kit, api_error
from .metrics import metrics_route, on_public_listener
from .pages import Pages
from .ratelimit import RateLimit, RateLimitGuard
from .security import BrowserBinding

log = logging.getLogger("service.web")

STATIC = Path(__file__).parent / "static"
DATABASE_BUSY_RETRY_AFTER = "1"  # seconds: SQLite's lock or a pooled connection is usually free again by then


class WebParts(ApiParts, AdminParts, Protocol):
    """What the web app is built from (the connector's `Runtime` is one); the `/v1` API's parts among them."""

    store: Store
    vault: Vault
    clock: Clock
    browser: BrowserFlow
    verification: IdentityStep
    verifier: IdentityVerifier
    metrics: Metrics
    rate_limiter: RateLimiter
    elicitations: Elicitations

    @property
    def demo_user(self) -> Identity | None:
        """Whom `/demo/start` acts for (demo mode only)."""


def _is_api(request: Request) -> bool:
    return request.url.path.startswith("/v1/")


def create_app(parts: WebParts, *, console_only: bool = False) -> Starlette:
    """The connector's web app; with `console_only`, the operator console's own listener (`admin.port`): the
    console's routes alone, behind the same front (request ids, security headers, rate limits, input checks)."""
    settings, store = parts.settings, parts.store
    # Demo routes exist only where nobody else can reach them: `Settings` refuses `demo` anywhere else.
    demo_user = parts.demo_user if settings.demo else None
    pages = Pages(demo=demo_user is not None)
    https = settings.public_base_url.startswith("https://")
    binding = BrowserBinding(parts.vault, secure=https)
    # Handlers that learn the elicitation only from a request body use it through the kit's `limit`.
    guard = RateLimitGuard(
        parts.rate_limiter,
        audit=store.audit,
        pages=pages,
        now=parts.clock,
        metrics=parts.metrics,
    )
    browser = BrowserRoutes(
        parts.browser,
        parts.verification,
        pages,
        binding,
        parts.vault,
        public_host=settings.public_host,
        trusted_proxies=settings.server.trusted_proxies,
    )

    credential_form = CredentialRoutes(CredentialStep(parts.browser), pages, binding, parts.vault)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            await store.ping()
            await store.check_schema()
        except SchemaNotCurrent as exc:
            # Where the database is (user, host, name) goes to the log only.
            log.warning("readiness check failed: %s", exc)
            return JSONResponse(
                {"status": "unready", "code": exc.code, "message": f"the database {exc.problem}"}, status_code=503
            )
        except Exception as exc:
            log.warning("readiness check failed: %s: %s", type(exc).__name__, exc)
            return JSONResponse(
                {
                    "status": "unready",
                    "code": "database_unreachable",
                    "message": "the database cannot be reached",
                },
                status_code=503,
            )
        return JSONResponse({"status": "ready"})

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FlowRefused)
        return api_error(exc) if _is_api(request) else pages.error(request, exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404 and (target := without_trailing_slash(request)) is not None:
            return RedirectResponse(target, status_code=307)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, f"http_{exc.status_code}")
        if code in ("not_found", "method_not_allowed"):
            return await refused(request, FlowRefused(code))
        return pages.message(request, exc.status_code, "Error", "This request cannot be served.", code=code)

    def without_trailing_slash(request: Request) -> str | None:
        """`/connect/abc/` -> `<public_base_url>/connect/abc` when that is a route: on our origin, never the Host's."""
        raw_path: bytes = request.scope.get("raw_path") or request.url.path.encode()
        if len(raw_path) < 2 or not raw_path.endswith(b"/"):
            return None
        path = raw_path.rstrip(b"/").decode("ascii", errors="replace")
        probe = {**request.scope, "path": unquote(path), "method": "GET"}
        if not any(route.matches(probe)[0] is not Match.NONE for route in app.router.routes):
            return None
        query = request.scope.get("query_string", b"").decode("ascii", errors="replace")
        return settings.public_base_url + path + (f"?{query}" if query else "")

    async def server_error(request: Request, exc: Exception) -> Response:
        if database_busy(exc):  # the world, not a bug: no stack, and the client may try again
            cause = getattr(exc, "orig", None) or exc  # the driver's words, without SQLAlchemy's statement text
            reason = (str(cause).splitlines() or [type(cause).__name__])[0]
            log.warning("the database was busy on %s %s: %s", request.method, request.url.path, reason)
            response = await refused(request, FlowRefused("database_busy"))
            response.headers["Retry-After"] = DATABASE_BUSY_RETRY_AFTER
            return response
        log.error("unhandled error on %s %s: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
        return await refused(request, FlowRefused("internal_error"))

    draining = Draining()  # long-lived responses end when the server starts to stop
    home = Home(pages, settings, parts.providers, parts.elicitations, demo_user)
    verifier_routes = parts.verifier.routes(Kit(parts.verification, binding, guard, settings.server.trusted_proxies))
    name = parts.verifier.name
    routes: list[BaseRoute] = [
        Route("/", home.page, methods=["GET"]),
        *([Route("/demo/start", home.demo_start, methods=["GET"])] if home.demo_user is not None else []),
        Route("/connect/{elicitation_id}", checked(browser.connect_page), methods=["GET"]),
        Route("/connect/{elicitation_id}", checked(browser.connect_submit), methods=["POST"]),
        Route("/connect/{elicitation_id}/done", checked(browser.done_page), methods=["GET"]),
        Route("/connect", browser.connect_page, methods=["GET"]),
        Route("/connect/{elicitation_id}/credentials", checked(credential_form.form_page), methods=["GET"]),
        Route("/connect/{elicitation_id}/credentials", checked(credential_form.form_submit), methods=["POST"]),
        Route("/callback/{provider}", checked(browser.callback), methods=["GET"]),
        Route("/callback/{provider}/failed/{ticket}", checked(browser.failed_page), methods=["GET"]),
        *_mounted(f"/identity/{name}", verifier_routes.browser),
        *_mounted(f"/v1/identity/{name}", verifier_routes.api),
        *(api_routes(parts, draining) if settings.api.enabled else []),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        jwks_route(parts.vault),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    console = admin_routes(parts, pages) if settings.admin.enabled else []
    if console_only:  # the console's own listener: nothing else is served there
        routes = [*console, Route("/healthz", healthz, methods=["GET"]), routes[-1]]
    elif settings.admin.port is None:
        routes[-1:-1] = console  # before /static
    if not console_only and on_public_listener(settings):
        routes.append(metrics_route(parts.metrics, settings.metrics.bearer_token))
    elif settings.metrics.enabled and settings.metrics.port is None:
        log.warning(
            "/metrics is not served: on a public deployment set metrics.bearer_token "
            "(CONNECTOR_METRICS__BEARER_TOKEN) or metrics.port (its own listener)"
        )
    # Outermost: the request id and the security headers on every response (an error page's too); then the client
    # address (behind trusted proxies), the rate limits every request counts against (malformed ones included),
    # and the input checks, before any route runs.
    front = functools.partial(
        Front,
        https=https,
        forwarded=ForwardedClient(trusted_proxies=settings.server.trusted_proxies),
        rate_limit=RateLimit(guard),
        inputs=InputGuard(body_limits=_body_limits(parts)),
        refuse=refused,
        on_error=server_error,
    )
    app = _ConnectorApp(
        front,
        routes=routes,
        exception_handlers={FlowRefused: refused, HTTPException: http_error, Exception: server_error},
    )
    app.state.draining = draining  # the server (web/server.py) sets it when it starts to stop
    # Starlette builds its slash redirects from the Host header; `without_trailing_slash` uses public_base_url.
    app.router.redirect_slashes = False
    return app


class _ConnectorApp(Starlette):
    """Starlette with `Front` (request id, security headers, client address, rate limits, input checks, the page
    for an unhandled error) in place of its own middleware stack, in front of its exception handlers and routes."""

    def __init__(self, front: Callable[[ASGIApp], ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._front = front

    def build_middleware_stack(self) -> ASGIApp:
        handlers = {key: value for key, value in self.exception_handlers.items() if key not in (500, Exception)}
        return self._front(ExceptionMiddleware(self.router, handlers=handlers))


def _body_limits(parts: WebParts) -> dict[str, int]:
    """Larger bodies where a route streams them: the token proxy's uploads."""
    if not parts.settings.api.enabled:
        return {}
    return {"/v1/proxy/": parts.settings.api.proxy_max_request_bytes}


def _mounted(prefix: str, routes: Sequence[VerifierRoute]) -> list[BaseRoute]:
    """A verifier's routes under its prefix; a route with path "" answers at the prefix itself."""
    return [Route(prefix + route.path, checked(route.endpoint), methods=list(route.methods)) for route in routes]
