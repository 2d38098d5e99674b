"""The composition root: settings in, one wired `Runtime` out, and the web app built on it.

The only module that knows every part. Nothing imports it but the CLI, the public `Connector` factory and tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import ValidationError

from .config import (
    CONFIG_ENV_VAR,
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    Settings,
    nearest,
    setting_env_var,
    setting_paths,
    unknown_key_problem,
)
from .core.agent_api import AgentApi
from .core.browser import BrowserFlow
from .core.clock import Clock
from .core.errors import ConnectorError
from .core.events import ElicitationEvent
from .core.identity import Identity
from .core.lifecycle import Elicitations
from .core.ports import AuditGate
from .core.records import ElicitationRecord
from .core.retention import RetentionPolicy
from .core.settings import FlowSettings
from .core.sweeper import Sweeper
from .core.verification import IdentityStep
from .core.webhooks import WebhookDispatcher, WebhookEndpoints, WebhookPolicy
from .events import HttpWebhookSender, LocalBus, OutboxFeed, PgBus, Replica, WebhookWorker
from .identity import IdentityVerifier, VerifierContext
from .identity import registry as verifiers
from .metrics import Metrics
from .oauth import HttpSettings, ProviderGateway, ProviderHttp
from .oauth.check import ProviderReport, log_provider_problems
from .providers import (
    PROVIDER_ENV_SUFFIXES,
    ProviderCatalog,
    load_catalog,
    provider_env_var,
    provider_setting_env_vars,
)
from .store import PoolSettings, Store
from .tokens import TokenAccess
from .vault import Vault, load_key_ring

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .acp import AcpAuthorizer
    from .web.ratelimit import RateLimiter

TEST_ENV_PREFIX = "CONNECTOR_TEST_"  # reserved for test suites' own variables (e.g. CONNECTOR_TEST_POSTGRES_URL)
PROVIDER_ENV_PREFIX = "CONNECTOR_PROVIDER_"


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
    identity: IdentityStep
    tokens: TokenAccess
    metrics: Metrics
    feed: OutboxFeed
    sweeper: Sweeper
    agent_api: AgentApi
    rate_limiter: RateLimiter
    replica: Replica
    webhooks: WebhookEndpoints
    webhook_worker: WebhookWorker | None  # None when this replica does not deliver (`webhooks.deliver`)
    # Built on first use: only a process that speaks ACP itself imports the SDK (a sidecar never does).
    _acp: AcpAuthorizer[ElicitationRecord, ElicitationEvent] | None = field(default=None, init=False, repr=False)
    # Started by `start`: reads each configured provider's discovery document and logs what is wrong.
    provider_check: asyncio.Task[list[ProviderReport]] | None = field(default=None, init=False, repr=False)

    @property
    def acp(self) -> AcpAuthorizer[ElicitationRecord, ElicitationEvent]:
        """The embedded face's ACP side: sends elicitation/create and elicitation/complete on attached connections."""
        if self._acp is None:
            from .acp import AcpAuthorizer, EmbeddedLifecycle

            self._acp = AcpAuthorizer(EmbeddedLifecycle(self.elicitations, self.bus, self.metrics))
        return self._acp

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
        self.provider_check = asyncio.create_task(log_provider_problems(self.providers))

    async def close(self) -> None:
        if self.provider_check is not None:
            self.provider_check.cancel()
            await asyncio.gather(self.provider_check, return_exceptions=True)
        await self.sweeper.close()
        await self.feed.close()
        if self.webhook_worker is not None:
            await self.webhook_worker.close()
        if self._acp is not None:
            await self._acp.close()
        await self.replica.close()
        await self.bus.close()
        await self.providers.aclose()
        await self.store.close()


def flow_settings(settings: Settings) -> FlowSettings:
    return FlowSettings(
        public_base_url=settings.public_base_url,
        agent_name=settings.agent_name,
        elicitation_ttl=timedelta(seconds=settings.elicitation.ttl_seconds),
        max_mismatches=settings.identity.max_mismatches,
        verifier_name=settings.identity.verifier,
    )


def webhook_policy(settings: Settings) -> WebhookPolicy:
    section = settings.webhooks
    return WebhookPolicy(
        allow_private_addresses=section.allow_private_addresses,
        timeout=timedelta(seconds=section.timeout_seconds),
        retry_initial=timedelta(seconds=section.retry_initial_seconds),
        retry_max=timedelta(seconds=section.retry_max_seconds),
        max_age=timedelta(seconds=section.max_age_seconds),
    )


def build_webhooks(
    settings: Settings, store: Store, vault: Vault, bus: LocalBus, clock: Clock, metrics: Metrics
) -> tuple[WebhookEndpoints, WebhookWorker | None]:
    """The tenants' webhook endpoints, and this replica's delivery task (unless `webhooks.deliver` is off)."""
    policy = webhook_policy(settings)
    endpoints = WebhookEndpoints(store.webhooks, store.outbox, vault, policy, clock)
    if not settings.webhooks.deliver:
        return endpoints, None
    sender = HttpWebhookSender(
        timeout=settings.webhooks.timeout_seconds, allow_private=settings.webhooks.allow_private_addresses
    )
    # Without metrics exposed, the backlog is not read at all.
    exposed = metrics if settings.metrics.enabled else None
    dispatcher = WebhookDispatcher(endpoints, store.outbox, sender, store.origin, metrics=exposed)
    return endpoints, WebhookWorker(dispatcher, bus, sender, interval=settings.webhooks.poll_interval_seconds)


def pool_settings(settings: Settings) -> PoolSettings:
    database = settings.database
    return PoolSettings(size=database.pool_size, overflow=database.max_overflow, timeout=database.pool_timeout_seconds)


def retention_policy(settings: Settings) -> RetentionPolicy:
    retention = settings.retention
    return RetentionPolicy(
        elicitation_days=retention.elicitation_days,
        verification_days=retention.verification_days,
        audit_days=retention.audit_days,
        event_days=retention.event_days,
        webhook_delivery_days=retention.webhook_delivery_days,
        batch_size=retention.batch_size,
    )


def build_vault(settings: Settings) -> Vault:
    ring = load_key_ring(settings.vault.keys, settings.vault.key_file, settings.vault.primary_key_id)
    if ring is None:
        raise settings.config_error(
            ("vault", "keys"),
            "no token-encryption key is configured: run `acp-connector keys generate` and set "
            "CONNECTOR_VAULT__KEYS or vault.key_file",
        )
    return Vault(ring)


def build_gateway(settings: Settings, catalog: ProviderCatalog, metrics: Metrics) -> ProviderGateway:
    """The one gateway to the catalog's providers, with pooled HTTP as `[providers]` says."""
    section = settings.providers
    http = ProviderHttp(
        HttpSettings(
            timeout_seconds=section.http_timeout_seconds,
            max_connections=section.http_max_connections,
            max_keepalive_connections=section.http_max_keepalive_connections,
            keepalive_expiry_seconds=section.http_keepalive_expiry_seconds,
        )
    )
    return ProviderGateway(catalog, http=http, discovery_ttl=section.discovery_ttl_seconds, metrics=metrics)


def build_verifier(ctx: VerifierContext) -> IdentityVerifier:
    """The verifier `identity.verifier` names, built from its `[identity.<name>]` section (ConfigError if unusable)."""
    identity = ctx.settings.identity
    plugin = verifiers.get(identity.verifier)
    if plugin is None:
        known = ", ".join(sorted(verifiers.plugins()))
        raise ctx.settings.config_error(("identity", "verifier"), f"unknown verifier (known: {known})")
    try:
        section = plugin.settings_model.model_validate(identity.section(plugin.name))
    except ValidationError as exc:
        raise ctx.settings.section_error(("identity", plugin.name), exc, plugin.settings_model) from None
    return plugin.build(ctx, section)


def configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> list[tuple[str, str]]:
    """(key, sentence) for each thing in the configuration that nothing reads, with the nearest valid name:
    CONNECTOR_* variables that are no setting, `[identity.<name>]` tables of no verifier, unknown keys in the
    table of a verifier that is not the chosen one (the chosen one's are errors). `CONNECTOR_TEST_*` is left to
    test suites. Without `catalog`, reads it if it can (else provider variables are not checked)."""
    if catalog is None:
        try:
            catalog = load_catalog(settings.providers.catalog, env=settings.environment())
        except ConnectorError:
            catalog = None
    found: list[tuple[str, str]] = []
    plugins = verifiers.plugins()
    known = {CONFIG_ENV_VAR}
    for path in setting_paths():
        known.update(setting_env_var(path[:depth]) for depth in range(1, len(path) + 1))
    for name, each in plugins.items():
        known.add(setting_env_var(("identity", name)))
        known.update(setting_env_var(("identity", name, field)) for field in each.settings_model.model_fields)
    if catalog is not None:
        known.update(
            provider_env_var(entry.name, suffix) for entry in catalog.entries() for suffix in PROVIDER_ENV_SUFFIXES
        )
        known.update(variable for entry in catalog.entries() for variable in provider_setting_env_vars(entry.name))
        in_file = [entry.name for entry in catalog.entries() if not entry.environment_only]
        for entry in catalog.entries():
            if entry.environment_only:
                close = nearest(entry.name, in_file)
                hint = f": a misspelling of '{close}'?" if close else ""
                found.append(
                    (
                        f"providers.{entry.name}",
                        f"provider '{entry.name}' is described only by CONNECTOR_PROVIDERS__"
                        f"{entry.name.upper()}__* variables (no [{entry.name}] table in {catalog.source}){hint}",
                    )
                )
    identity_prefix = setting_env_var(("identity",)) + ENV_NESTED_DELIMITER
    for variable in sorted(settings.environment()):
        name = variable.upper()
        if name in known or name.startswith(TEST_ENV_PREFIX) or name.startswith(identity_prefix):
            continue  # identity tables are checked below, by table
        if catalog is None and name.startswith(PROVIDER_ENV_PREFIX):
            continue  # without a catalog, provider names cannot be checked
        # Compared without the common prefix, which would make every name look alike.
        close = nearest(name.removeprefix(ENV_PREFIX), [k.removeprefix(ENV_PREFIX) for k in known])
        hint = f": did you mean {ENV_PREFIX}{close}?" if close else " (see docs/reference.md)"
        found.append((variable, f"environment variable {variable} is not a setting and is ignored{hint}"))
    for name, table in settings.identity.model_extra.items() if settings.identity.model_extra else ():
        if not isinstance(table, dict):
            continue
        plugin = plugins.get(name)
        if plugin is None:
            origin = settings.origin(("identity", name))
            close = nearest(name, plugins)
            hint = f": did you mean [identity.{close}]?" if close else f" (verifiers: {', '.join(sorted(plugins))})"
            found.append((f"identity.{name}", f"{origin}: identity.{name}: no verifier has this name, ignored{hint}"))
        elif name != settings.identity.verifier:
            fields = plugin.settings_model.model_fields
            for key in (key for key in table if key not in fields):
                origin = settings.origin(("identity", name, key))
                found.append(
                    (f"identity.{name}.{key}", f"{origin}: identity.{name}.{key}: {unknown_key_problem(key, fields)}")
                )
    return found


def report_configuration_warnings(settings: Settings, catalog: ProviderCatalog | None = None) -> None:
    """Log `configuration_warnings` (once per settings)."""
    for key, message in configuration_warnings(settings, catalog):
        settings.warn(key, message)


def build_runtime(settings: Settings) -> Runtime:
    """Wire one connector from its settings. Raises ConfigError when the settings cannot work."""
    demo_problem = settings.demo_problem()
    if demo_problem is not None:
        raise settings.config_error(("demo",), demo_problem)
    clock = Clock()
    vault = build_vault(settings)
    store = Store.from_url(settings.database.url, pool_settings(settings))
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    report_configuration_warnings(settings, catalog)
    metrics = build_metrics(store, (entry.name for entry in catalog.entries()))
    providers = build_gateway(settings, catalog, metrics)
    bus = build_bus(settings, store, clock, metrics)
    feed = OutboxFeed(store.outbox, bus, interval=settings.events.poll_interval_seconds)
    replica = Replica(store, bus.dispatch, settings.replicas, clock, metrics)
    if isinstance(bus, PgBus):
        bus.feed = feed
        bus.on_reconnect.append(replica.catch_up)
    flow = flow_settings(settings)
    rate_limiter, audit_budget = build_rate_limits(settings, store, clock)
    elicitations = Elicitations(store, bus, providers, flow, clock, metrics, unattributed=audit_budget)
    browser = BrowserFlow(elicitations, store, vault, providers)
    verifier = build_verifier(VerifierContext(settings, flow, store, vault, providers, clock))
    webhooks, webhook_worker = build_webhooks(settings, store, vault, bus, clock, metrics)
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
        identity=IdentityStep(browser, verifier),
        tokens=TokenAccess(store, vault, providers, bus, clock, metrics),
        metrics=metrics,
        feed=feed,
        replica=replica,
        webhooks=webhooks,
        webhook_worker=webhook_worker,
        sweeper=Sweeper(
            elicitations,
            retention_policy(settings),
            interval=settings.elicitation.sweep_interval_seconds,
            retention_interval=settings.retention.interval_seconds,
        ),
        agent_api=AgentApi(elicitations, store, bus, clock),
        rate_limiter=rate_limiter,
    )


def build_rate_limits(settings: Settings, store: Store, clock: Clock) -> tuple[RateLimiter, AuditGate]:
    """The rate limiter of `[rate_limit]`, and the budget of audit rows that requests without credentials get."""
    from .web.ratelimit import AuditBudget, RateLimiter

    limiter = RateLimiter(settings.rate_limit)
    return limiter, AuditBudget(limiter, store.audit, clock)


def build_bus(settings: Settings, store: Store, clock: Clock, metrics: Metrics) -> LocalBus:
    """PostgreSQL: events cross the replicas at once (LISTEN/NOTIFY). SQLite (one process): they stay in it."""
    if store.db.dialect != "postgresql":
        return LocalBus()
    return PgBus(store, metrics=metrics, clock=clock, ping_seconds=settings.replicas.heartbeat_seconds)


def build_metrics(store: Store, providers: Iterable[str]) -> Metrics:
    """The metrics, with the gauges read from the store at each scrape."""
    metrics = Metrics(providers)

    async def sample() -> None:
        metrics.db_pool_in_use.set(store.pool_in_use())
        for status, count in (await store.elicitations.count_open()).items():
            metrics.pending.labels(status.value).set(count)

    metrics.add_sampler(sample)
    return metrics


def build_web_app(runtime: Runtime) -> Starlette:
    from .web.api import ApiParts
    from .web.app import WebParts, create_app

    return create_app(
        WebParts(
            settings=runtime.settings,
            store=runtime.store,
            vault=runtime.vault,
            browser=runtime.browser,
            identity=runtime.identity,
            verifier=runtime.verifier,
            clock=runtime.clock,
            metrics=runtime.metrics,
            rate_limiter=runtime.rate_limiter,
            api=ApiParts(
                api=runtime.agent_api,
                tokens=runtime.tokens,
                providers=runtime.providers,
                bus=runtime.bus,
                webhooks=runtime.webhooks,
                settings=runtime.settings.api,
                public_base_url=runtime.settings.public_base_url,
            )
            if runtime.settings.api.enabled
            else None,
            providers=runtime.providers,
            elicitations=runtime.elicitations,
            demo_user=demo_user(runtime),
        )
    )


def build_metrics_app(runtime: Runtime) -> Starlette | None:
    """The separate metrics listener's app, when `metrics.port` is set."""
    from .web.metrics import metrics_app

    config = runtime.settings.metrics
    return metrics_app(runtime.metrics, runtime.settings) if config.enabled and config.port is not None else None


async def serve_runtime(runtime: Runtime) -> None:
    """Serve the web routes on the configured host and port (and the metrics on theirs) until cancelled."""
    from .web.server import serve

    settings = runtime.settings
    listeners = [serve(build_web_app(runtime), settings.server.host, settings.server.port)]
    metrics = build_metrics_app(runtime)
    if metrics is not None:
        assert settings.metrics.port is not None
        listeners.append(serve(metrics, settings.metrics.host, settings.metrics.port))
    await asyncio.gather(*listeners)


def demo_user(runtime: Runtime) -> Identity | None:
    """Whom the demo acts for: the local verifier's one user (demo mode needs that verifier)."""
    user = getattr(runtime.verifier, "user", None)
    if not runtime.settings.demo or not callable(user):
        return None
    identity = user()
    return identity if isinstance(identity, Identity) else None
