"""The composition root: wires the parts (`service.factories`) into one `Runtime`, and serves it.

The only module that knows every part. Each part's wiring is complete when it is constructed; the web app is
built from the `Runtime` itself (it is the `WebParts` the web layer asks for). Nothing imports this module but
the CLI's `serve`, the public `Connector` factory and tests.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from .config import Settings
from .config_warnings import report_configuration_warnings
from .console import Console
from .core.agent_api import AgentApi
from .core.browser import BrowserFlow
from .core.errors import PortUnavailable
from .core.events import ElicitationEvent
from .core.identity import Identity
from .core.lifecycle import Elicitations
from .core.ports import AuditGate
from .core.records import ElicitationRecord
from .core.sweeper import Sweeper
from .core.verification import IdentityStep
from .core.webhooks import WebhookEndpoints
from .events import LocalBus, OutboxFeed, Replica, WebhookWorker
from .factories import (
    build_bus,
    build_gateway,
    build_metrics,
    build_store,
    build_vault,
    build_verifier,
    build_webhooks,
)
from .identity import IdentityVerifier, VerifierContext
from .metrics import Metrics
from .oauth import ProviderGateway
from .oauth.check import ProviderReport, log_provider_problems
from .providers import load_catalog
from .store import Store
from .tokens import ProactiveRefresh, TokenAccess
from .util.clock import Clock
from .vault import Vault

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .acp import AcpAuthorizer
    from .mcp import McpAuthorizer
    from .mcp.authorizer import Resolve
    from .rate_limiter import RateLimiter


@dataclass
class Runtime:
    """Every part of one connector instance, wired."""

    settings: Settings
    clock: Clock
    store: Store
    vault: Vault
    providers: ProviderGateway
    bus: LocalBus
    elicitations: Elicitations
    browser: BrowserFlow
    verifier: IdentityVerifier
    verification: IdentityStep  # the browser flow's identity step, with `verifier`
    tokens: TokenAccess
    metrics: Metrics
    feed: OutboxFeed
    sweeper: Sweeper
    proactive_refresh: ProactiveRefresh | None  # None unless `[grants] proactive_refresh`
    agent_api: AgentApi
    rate_limiter: RateLimiter
    replica: Replica
    webhooks: WebhookEndpoints
    webhook_worker: WebhookWorker | None  # None when this replica does not deliver (`webhooks.deliver`)
    console: Console  # the operator console's operations (its pages: `[admin]`)
    # Built on first use: only a process that speaks ACP itself imports the SDK (a sidecar never does).
    _acp: AcpAuthorizer[ElicitationRecord, ElicitationEvent] | None = field(default=None, init=False, repr=False)
    # Built on first use: only a process that serves MCP imports the `mcp` SDK (the [mcp] extra).
    _mcp: McpAuthorizer[ElicitationRecord, ElicitationEvent] | None = field(default=None, init=False, repr=False)
    # Started by `start`: reads each configured provider's discovery document and logs what is wrong.
    provider_check: asyncio.Task[list[ProviderReport]] | None = field(default=None, init=False, repr=False)

    @property
    def demo_user(self) -> Identity | None:
        """Whom the demo acts for: the local verifier's one user (demo mode needs that verifier)."""
        user = getattr(self.verifier, "user", None)
        if not self.settings.demo or not callable(user):
            return None
        identity = user()
        return identity if isinstance(identity, Identity) else None

    @property
    def acp(self) -> AcpAuthorizer[ElicitationRecord, ElicitationEvent]:
        """The embedded face's ACP side: sends elicitation/create and elicitation/complete on attached connections."""
        if self._acp is None:
            from .acp import AcpAuthorizer, EmbeddedLifecycle

            self._acp = AcpAuthorizer(EmbeddedLifecycle(self.elicitations, self.bus, self.metrics))
        return self._acp

    def mcp(self, resolve: Resolve | None = None) -> McpAuthorizer[ElicitationRecord, ElicitationEvent]:
        """The embedded face's MCP side (built the first time, with `resolve` for the provider and scopes asked)."""
        if self._mcp is None:
            from .faces import EmbeddedLifecycle
            from .mcp import McpAuthorizer

            self._mcp = McpAuthorizer(EmbeddedLifecycle(self.elicitations, self.bus, self.metrics), resolve)
        return self._mcp

    async def start(self) -> None:
        """Refuse to run on a database this code cannot run on; then hear the other replicas, join them, start
        the feed and the sweeper, and check the providers in the background."""
        await self.store.check_schema()
        await self.bus.start()
        await self.replica.start()
        await self.feed.start()
        if self.webhook_worker is not None:
            await self.webhook_worker.start()
        self.sweeper.start()
        if self.proactive_refresh is not None:
            self.proactive_refresh.start()
        self.provider_check = asyncio.create_task(log_provider_problems(self.providers))

    async def close(self) -> None:
        if self.provider_check is not None:
            self.provider_check.cancel()
            await asyncio.gather(self.provider_check, return_exceptions=True)
        await self.sweeper.close()
        if self.proactive_refresh is not None:
            await self.proactive_refresh.close()
        await self.feed.close()
        if self.webhook_worker is not None:
            await self.webhook_worker.close()
        if self._acp is not None:
            await self._acp.close()
        if self._mcp is not None:
            await self._mcp.close()
        await self.replica.close()
        await self.bus.close()
        await self.console.close()
        await self.providers.aclose()
        await self.store.close()


def build_runtime(settings: Settings) -> Runtime:
    """Wire one connector from its settings. Raises ConfigError when the settings cannot work."""
    clock = Clock()
    vault = build_vault(settings)
    store = build_store(settings)
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    report_configuration_warnings(settings, catalog)
    metrics = build_metrics(store, (entry.name for entry in catalog.entries()))
    providers = build_gateway(settings, catalog, metrics, vault)
    bus = build_bus(settings, store, clock, metrics)
    feed = OutboxFeed(store.outbox, bus, interval=settings.events.poll_interval_seconds)
    replica = Replica(store, bus, settings.replicas, clock, metrics)
    flow = settings.flow()
    rate_limiter, audit_budget = build_rate_limits(settings, store, clock)
    elicitations = Elicitations(
        store, bus, providers, flow, clock, metrics, unattributed=audit_budget, sharing=settings.tenants.sharing()
    )
    browser = BrowserFlow(elicitations, store, vault, providers, flow)
    verifier = build_verifier(VerifierContext(settings, flow, store, vault, providers, clock))
    webhooks, webhook_worker = build_webhooks(settings, store, vault, bus, clock, metrics)
    tokens = TokenAccess(store, vault, providers, bus, clock, metrics, settings.grants.backoff())
    proactive = settings.grants.proactive()
    return Runtime(
        settings=settings,
        clock=clock,
        store=store,
        vault=vault,
        providers=providers,
        bus=bus,
        elicitations=elicitations,
        browser=browser,
        verifier=verifier,
        verification=IdentityStep(browser, verifier),
        tokens=tokens,
        console=Console(
            store,
            tokens,
            elicitations,
            webhooks,
            vault,
            clock,
            timedelta(seconds=settings.admin.counts_max_age_seconds),
        ),
        metrics=metrics,
        feed=feed,
        replica=replica,
        webhooks=webhooks,
        webhook_worker=webhook_worker,
        sweeper=Sweeper(
            elicitations,
            store.retention,
            settings.retention.policy(),
            interval=settings.elicitation.sweep_interval_seconds,
            retention_interval=settings.retention.interval_seconds,
        ),
        proactive_refresh=ProactiveRefresh(tokens, proactive) if proactive is not None else None,
        agent_api=AgentApi(elicitations, store, bus, clock),
        rate_limiter=rate_limiter,
    )


def build_rate_limits(settings: Settings, store: Store, clock: Clock) -> tuple[RateLimiter, AuditGate]:
    """The rate limiter of `[rate_limit]`, and the budget of audit rows that requests without credentials get."""
    from .rate_limiter import AuditBudget, RateLimiter

    limiter = RateLimiter(settings.rate_limit)
    return limiter, AuditBudget(limiter, store.audit, clock)


def build_web_app(runtime: Runtime) -> Starlette:
    from .web.app import create_app

    return create_app(runtime)


def build_admin_app(runtime: Runtime) -> Starlette | None:
    """The operator console's own listener's app, when `admin.port` is set."""
    from .web.app import create_app

    config = runtime.settings.admin
    return create_app(runtime, console_only=True) if config.enabled and config.port is not None else None


def build_metrics_app(runtime: Runtime) -> Starlette | None:
    """The separate metrics listener's app, when `metrics.port` is set."""
    from .web.metrics import metrics_app

    config = runtime.settings.metrics
    return metrics_app(runtime.metrics, runtime.settings) if config.enabled and config.port is not None else None


async def serve_runtime(runtime: Runtime, on_listening: Callable[[], None] | None = None) -> None:
    """Serve the web routes on the configured host and port (the metrics and the console on theirs when set) until
    cancelled.

    Every address is bound before anything is served: one that cannot be raises PortUnavailable, and nothing
    was served. `on_listening` runs once all are bound.
    """
    from .web.server import bind, serve

    settings = runtime.settings
    apps = [(build_web_app(runtime), settings.server.host, settings.server.port)]
    metrics = build_metrics_app(runtime)
    if metrics is not None:
        assert settings.metrics.port is not None
        apps.append((metrics, settings.metrics.host, settings.metrics.port))
    console = build_admin_app(runtime)
    if console is not None:
        assert settings.admin.port is not None
        apps.append((console, settings.admin.host, settings.admin.port))
    sockets: list[socket.socket] = []
    try:
        for _, host, port in apps:
            sockets.append(bind(host, port))
    except PortUnavailable:
        for sock in sockets:
            sock.close()
        raise
    if on_listening is not None:
        on_listening()
    grace = settings.server.shutdown_grace_seconds
    served = (serve(app, sock, grace_seconds=grace) for (app, _, _), sock in zip(apps, sockets, strict=True))
    await asyncio.gather(*served)
