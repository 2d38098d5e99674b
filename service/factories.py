"""Each part of a connector built from its settings alone: the store, the vault, the provider gateway, the
verifier, the event bus, the metrics and the webhooks.

The composition root (`service.app`) wires these into one `Runtime`; the CLI's commands build the one part they
need here, without the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .store import PoolSettings, Store
from .vault import Vault, load_key_ring

if TYPE_CHECKING:  # each builder imports what it builds: `keys status` needs the store and the vault, not the web
    from .config import Settings
    from .core.webhooks import WebhookEndpoints
    from .events import LocalBus, WebhookWorker
    from .identity import IdentityVerifier, VerifierContext
    from .metrics import Metrics
    from .oauth import ProviderGateway
    from .providers import ProviderCatalog
    from .util.clock import Clock

__all__ = [
    "build_bus",
    "build_gateway",
    "build_metrics",
    "build_store",
    "build_vault",
    "build_verifier",
    "build_webhooks",
]


def build_store(settings: Settings) -> Store:
    """The store on `database.url`, with the pool `[database]` sizes."""
    database = settings.database
    pool = PoolSettings(size=database.pool_size, overflow=database.max_overflow, timeout=database.pool_timeout_seconds)
    return Store.from_url(database.url, pool)


def build_vault(settings: Settings) -> Vault:
    """The vault on the configured key ring (ConfigError when there is no key)."""
    ring = load_key_ring(settings.vault.keys, settings.vault.key_file, settings.vault.primary_key_id)
    if ring is None:
        raise settings.config_error(
            ("vault", "keys"),
            "no token-encryption key is configured: run `acp-connector keys generate` and set "
            "CONNECTOR_VAULT__KEYS or vault.key_file",
        )
    return Vault(ring)


def build_gateway(
    settings: Settings, catalog: ProviderCatalog, metrics: Metrics, vault: Vault | None = None
) -> ProviderGateway:
    """The one gateway to the catalog's providers, with pooled HTTP as `[providers]` says; with `vault`, it signs
    private_key_jwt assertions with the key the vault derives."""
    from .oauth import ClientKeys, HttpSettings, ProviderGateway, ProviderHttp

    section = settings.providers
    http = ProviderHttp(
        HttpSettings(
            timeout_seconds=section.http_timeout_seconds,
            max_connections=section.http_max_connections,
            max_keepalive_connections=section.http_max_keepalive_connections,
            keepalive_expiry_seconds=section.http_keepalive_expiry_seconds,
        )
    )
    keys = ClientKeys(vault) if vault is not None else None
    return ProviderGateway(
        catalog, http=http, discovery_ttl=section.discovery_ttl_seconds, metrics=metrics, client_keys=keys
    )


def build_verifier(ctx: VerifierContext) -> IdentityVerifier:
    """The verifier `identity.verifier` names, built from its `[identity.<name>]` section (ConfigError if unusable)."""
    from pydantic import ValidationError

    from .identity import registry as verifiers

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


def build_bus(settings: Settings, store: Store, clock: Clock, metrics: Metrics) -> LocalBus:
    """PostgreSQL: events cross the replicas at once (LISTEN/NOTIFY). SQLite (one process): they stay in it."""
    from .events import LocalBus, PgBus

    if store.db.dialect != "postgresql":
        return LocalBus()
    return PgBus(store, metrics=metrics, clock=clock, ping_seconds=settings.replicas.heartbeat_seconds)


def build_metrics(store: Store, providers: Iterable[str]) -> Metrics:
    """The metrics, with the gauges read from the store at each scrape."""
    from .metrics import Metrics

    metrics = Metrics(providers)

    async def sample() -> None:
        metrics.db_pool_in_use.set(store.pool_in_use())
        for status, count in (await store.elicitations.count_open()).items():
            metrics.pending.labels(status.value).set(count)

    metrics.add_sampler(sample)
    return metrics


def build_webhooks(
    settings: Settings, store: Store, vault: Vault, bus: LocalBus, clock: Clock, metrics: Metrics
) -> tuple[WebhookEndpoints, WebhookWorker | None]:
    """The tenants' webhook endpoints, and this replica's delivery task (unless `webhooks.deliver` is off)."""
    from .core.webhooks import WebhookDispatcher, WebhookEndpoints
    from .events import HttpWebhookSender, WebhookWorker

    section = settings.webhooks
    endpoints = WebhookEndpoints(store.webhooks, store.outbox, vault, section.policy(), clock)
    if not section.deliver:
        return endpoints, None
    sender = HttpWebhookSender(timeout=section.timeout_seconds, allow_private=section.allow_private_addresses)
    # Without metrics exposed, the backlog is not read at all.
    exposed = metrics if settings.metrics.enabled else None
    dispatcher = WebhookDispatcher(
        endpoints, store.outbox, sender, store.origin, metrics=exposed, sharing=settings.tenants.sharing()
    )
    return endpoints, WebhookWorker(dispatcher, bus, sender, interval=section.poll_interval_seconds)
