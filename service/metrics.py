"""Prometheus metrics of one connector: its own registry, typed recording methods, bounded labels only.

Every label value comes from a closed set: provider names from the catalog (anything else is "other"),
elicitation statuses, endpoint and route names this code defines. No label ever carries a user, an id or a
URL. Gauges that describe shared state (pending elicitations, the database pool) are read when scraped; the
webhook backlog is read by the webhook worker on its own interval instead (a scrape never queries it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from enum import StrEnum

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from service.core.states import DeliveryStatus, ElicitationStatus

log = logging.getLogger("service.metrics")

OTHER = "other"
PREFIX = "acp_connector"

# From the callback's completion to `elicitation/complete` on the wire: milliseconds matter.
DELIVERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PROVIDER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WEBHOOK_BUCKETS = (*PROVIDER_BUCKETS, 60.0)  # an attempt is bounded by webhooks.timeout_seconds (at most 60)


class ProviderEndpoint(StrEnum):
    """The provider endpoints the connector calls (the `endpoint` label)."""

    DISCOVERY = "discovery"
    TOKEN = "token"  # noqa: S105 - the code exchange at the token endpoint, not a secret
    REFRESH = "refresh"  # the token endpoint, for a refresh
    MIGRATION = "migration"  # the token endpoint, for a legacy grant's token exchange (`legacy_token_exchange`)
    USERINFO = "userinfo"
    REVOCATION = "revocation"
    PAR = "par"  # the pushed authorization request endpoint (RFC 9126)
    CREDENTIAL_CHECK = "credential_check"  # the check request of a credential entry (an API key typed by the user)


class RefreshResult(StrEnum):
    REFRESHED = "refreshed"  # this process called the provider and stored the new set
    MIGRATED = "migrated"  # a legacy grant's non-expiring token was exchanged for an expiring one and stored
    REUSED = "reused"  # another process or task had refreshed it first: its set was used
    NEEDS_USER = "needs_user"  # the provider refused the grant for good: marked needs_user (reason: why)
    UNAVAILABLE = "unavailable"  # the provider could not answer (5xx, 429, timeout, no connection): backing off
    REJECTED = "rejected"  # the provider refused the refresh otherwise (e.g. invalid_client): backing off
    BACKED_OFF = "backed_off"  # not attempted: an earlier failure's backoff had not run out


class CompletionResult(StrEnum):
    SENT = "sent"
    UNDELIVERABLE = "undeliverable"


class WebhookResult(StrEnum):
    """What followed a webhook attempt (the `result` label)."""

    DELIVERED = "delivered"  # the endpoint answered 2xx
    RETRIED = "retried"  # it did not; another attempt is scheduled
    FAILED = "failed"  # it did not, and the delivery is too old for another: given up


WEBHOOK_RESULTS = {
    DeliveryStatus.DELIVERED: WebhookResult.DELIVERED,
    DeliveryStatus.PENDING: WebhookResult.RETRIED,
    DeliveryStatus.FAILED: WebhookResult.FAILED,
}

Sampler = Callable[[], Awaitable[None]]


class Metrics:
    """The connector's metrics. `render()` gives the Prometheus text exposition."""

    def __init__(self, providers: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._providers = frozenset(providers)
        self._samplers: list[Sampler] = []
        registry = self.registry
        self.flows_started = Counter(
            f"{PREFIX}_flows_started", "Elicitations created, by provider.", ["provider"], registry=registry
        )
        self.flows_ended = Counter(
            f"{PREFIX}_flows_ended",
            "Elicitations that reached a terminal status in this process, by provider and outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.completion_delivery = Histogram(
            f"{PREFIX}_completion_delivery_seconds",
            "From the callback storing the grant (the elicitation completed) to elicitation/complete sent.",
            buckets=DELIVERY_BUCKETS,
            registry=registry,
        )
        self.completions = Counter(
            f"{PREFIX}_completions",
            "Completed elicitations this process decided to notify: sent, or recorded as undeliverable.",
            ["result"],
            registry=registry,
        )
        self.pending = Gauge(
            f"{PREFIX}_pending_elicitations",
            "Elicitations not yet ended, in the whole database, by status.",
            ["status"],
            registry=registry,
        )
        self.refreshes = Counter(
            f"{PREFIX}_token_refreshes",
            "Token refreshes, by provider and result.",
            ["provider", "result"],
            registry=registry,
        )
        self.refresh_failures = Counter(
            f"{PREFIX}_token_refresh_failures",
            "Failed token refreshes, by provider and reason (revoked, account_changed, http_429, http_5xx, timeout, "
            "connection, oauth_error, bad_answer; key_rejected: an API key answered 401).",
            ["provider", "reason"],
            registry=registry,
        )
        self.provider_latency = Histogram(
            f"{PREFIX}_provider_request_seconds",
            "Calls to provider endpoints, by provider and endpoint (failed calls included).",
            ["provider", "endpoint"],
            buckets=PROVIDER_BUCKETS,
            registry=registry,
        )
        self.provider_errors = Counter(
            f"{PREFIX}_provider_errors",
            "Provider calls that failed, by provider and endpoint.",
            ["provider", "endpoint"],
            registry=registry,
        )
        self.rate_limited = Counter(
            f"{PREFIX}_rate_limited",
            "Requests refused by a rate limit, by route group and key kind.",
            ["route", "key"],
            registry=registry,
        )
        self.db_pool_in_use = Gauge(
            f"{PREFIX}_db_pool_connections_in_use",
            "Database connections checked out of this process's pool.",
            registry=registry,
        )
        # No tenant label: tenants are API-key names, as many as operators make (unbounded).
        self.webhook_deliveries = Counter(
            f"{PREFIX}_webhook_deliveries",
            "Webhook attempts this process made and recorded, by what followed: delivered (2xx), retried (another "
            "attempt is scheduled) or failed (given up).",
            ["result"],
            registry=registry,
        )
        for result in WebhookResult:
            self.webhook_deliveries.labels(result.value)  # every result is exposed, at 0 until it happens
        self.webhook_attempt_latency = Histogram(
            f"{PREFIX}_webhook_attempt_seconds",
            "Webhook attempts this process made, from signing to the answer's status line (or the error).",
            buckets=WEBHOOK_BUCKETS,
            registry=registry,
        )
        # Set by the webhook worker every poll interval from one aggregate read (not read at scrape): every replica
        # that delivers reports the same, database-wide backlog.
        self.webhook_waiting = Gauge(
            f"{PREFIX}_webhook_deliveries_waiting",
            "Webhook deliveries neither delivered nor given up, in the whole database (due, waiting for a retry, or "
            "in an attempt), as last read by this process's webhook worker.",
            registry=registry,
        )
        self.webhook_oldest_waiting = Gauge(
            f"{PREFIX}_webhook_oldest_waiting_seconds",
            "Age of the oldest webhook delivery waiting, in the whole database (0 when none), as last read by this "
            "process's webhook worker.",
            registry=registry,
        )
        self.bus_reconnects = Counter(
            f"{PREFIX}_event_bus_reconnects",
            "Times the cross-process event bus re-established its listening connection.",
            registry=registry,
        )

    # -- labels ----------------------------------------------------------------------------------------
    def provider(self, name: str | None) -> str:
        """The provider label: a catalog name, else "other" (a label never carries arbitrary input)."""
        return name if name is not None and name in self._providers else OTHER

    # -- recording -------------------------------------------------------------------------------------
    def flow_started(self, provider: str) -> None:
        self.flows_started.labels(self.provider(provider)).inc()

    def flow_ended(self, provider: str, status: ElicitationStatus) -> None:
        self.flows_ended.labels(self.provider(provider), status.value).inc()

    def completion(self, result: CompletionResult, seconds: float | None = None) -> None:
        self.completions.labels(result.value).inc()
        if seconds is not None:
            self.completion_delivery.observe(max(seconds, 0.0))

    def refresh(self, provider: str, result: RefreshResult, reason: str | None = None) -> None:
        """Count a refresh's result; a failure also by its reason (a bounded set of codes)."""
        self.refreshes.labels(self.provider(provider), result.value).inc()
        if reason is not None:
            self.refresh_failures.labels(self.provider(provider), reason).inc()

    @contextmanager
    def provider_call(self, provider: str, endpoint: ProviderEndpoint) -> Iterator[None]:
        """Time one provider call; an exception counts as an error and propagates."""
        label = self.provider(provider)
        start = time.perf_counter()
        try:
            yield
        except Exception:
            self.provider_failed(provider, endpoint)
            raise
        finally:
            self.provider_latency.labels(label, endpoint.value).observe(time.perf_counter() - start)

    def provider_failed(self, provider: str, endpoint: ProviderEndpoint) -> None:
        """Count a failed call of `endpoint` (also one that answered, with a refusal)."""
        self.provider_errors.labels(self.provider(provider), endpoint.value).inc()

    def rate_limit_refused(self, route: str, key: str) -> None:
        self.rate_limited.labels(route, key).inc()

    def webhook_attempt(self, status: DeliveryStatus | None, seconds: float) -> None:
        """One webhook attempt and the status its delivery took (None: another replica took it meanwhile, so
        what followed is that replica's to count)."""
        self.webhook_attempt_latency.observe(max(seconds, 0.0))
        result = None if status is None else WEBHOOK_RESULTS.get(status)
        if result is not None:
            self.webhook_deliveries.labels(result.value).inc()

    def webhook_backlog(self, waiting: int, oldest_seconds: float) -> None:
        self.webhook_waiting.set(waiting)
        self.webhook_oldest_waiting.set(max(oldest_seconds, 0.0))

    def bus_reconnected(self) -> None:
        self.bus_reconnects.inc()

    # -- exposition ------------------------------------------------------------------------------------
    def add_sampler(self, sampler: Sampler) -> None:
        """Run `sampler` before each scrape (it sets gauges from state read at that moment)."""
        self._samplers.append(sampler)

    async def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, gauges sampled first."""
        for sampler in self._samplers:
            try:
                await sampler()
            except Exception as exc:  # a scrape still answers; the gauges keep their last values
                log.warning("metrics sampling failed: %s", type(exc).__name__)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["CompletionResult", "Metrics", "ProviderEndpoint", "RefreshResult", "WebhookResult"]
