"""Delivering webhooks: new log entries become deliveries (once, across replicas), then each claimed attempt is
signed, sent and recorded, retried with backoff until the policy's `max_age`."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from ..events import GrantEvent
from ..handles import new_id
from ..ports import OutboxRepo, WebhookMetrics, WebhookSender
from ..records import AttemptRecord, AttemptResult, WebhookDeliveryRecord, WebhookEndpointRecord
from ..states import DeliveryStatus
from ..tenants import TenantSharing
from .endpoints import WebhookEndpoints
from .payload import for_tenant, webhook_body
from .signing import signed_headers

log = logging.getLogger("service.webhooks")

FAN_OUT_BATCH = 500
CLAIM_BATCH = 20
# How long a replica believes a read that found no endpoint at all (one registered in this process ends it at once).
NO_ENDPOINT_RECHECK = timedelta(seconds=30)
ERROR_TEXT_LIMIT = 120


class WebhookDispatcher:
    """One step of delivery (`step`): new log entries become deliveries, then the due attempts are made."""

    def __init__(
        self,
        endpoints: WebhookEndpoints,
        outbox: OutboxRepo,
        sender: WebhookSender,
        replica_id: str,
        rand: Callable[[], float] = random.random,
        metrics: WebhookMetrics | None = None,
        sharing: TenantSharing | None = None,
    ) -> None:
        self.sharing = sharing or TenantSharing()  # grant events go to the grant's tenant and those sharing it
        self.endpoints = endpoints
        self.repo = endpoints.repo
        self.outbox = outbox
        self.sender = sender
        self.replica_id = replica_id
        self.policy = endpoints.policy
        self.now = endpoints.now
        self.rand = rand
        self.metrics = metrics
        # When a read found no endpoint at all: (endpoints registered here by then, when to read again). Until then
        # a step reads nothing, so a deployment without webhooks pays no query per event or interval.
        self._none_seen: tuple[int, datetime] | None = None

    async def step(self) -> int:
        """Fan out what the log holds, then make the attempts that are due; how many attempts were made.

        Where no endpoint exists, that is believed for `NO_ENDPOINT_RECHECK` (or until one is registered in this
        process). Nothing is lost meanwhile: the log's cursor moves only in a fan-out, and a fan-out reads the
        endpoints it delivers to, so events wait in the log until a replica sees the new endpoint."""
        now = self.now()
        if self._none_seen is not None:
            registered, until = self._none_seen
            if registered == self.endpoints.registered_here and now < until:
                return 0
        endpoints = await self.repo.endpoints()
        if not endpoints:
            self._none_seen = (self.endpoints.registered_here, now + NO_ENDPOINT_RECHECK)
            return 0  # nothing to deliver to (the cursor catches up when an endpoint appears)
        self._none_seen = None
        while await self.fan_out(endpoints) == FAN_OUT_BATCH:
            pass
        made = 0
        while True:
            now = self.now()
            batch = await self.repo.claim_due(
                now=now, replica_id=self.replica_id, lease_until=now + self.policy.lease, limit=CLAIM_BATCH
            )
            # Concurrently: one slow endpoint does not hold up the others.
            await asyncio.gather(*(self.attempt(delivery) for delivery in batch))
            made += len(batch)
            if len(batch) < CLAIM_BATCH:
                return made

    async def report_backlog(self) -> None:
        """Set the backlog metrics from one aggregate read of the waiting deliveries. Nothing is read without metrics,
        or while the last step found no endpoint (then no delivery exists: an endpoint's go with it)."""
        if self.metrics is None:
            return
        if self._none_seen is not None:
            self.metrics.webhook_backlog(0, 0.0)
            return
        waiting, oldest = await self.repo.backlog()
        age = 0.0 if oldest is None else (self.now() - oldest).total_seconds()
        self.metrics.webhook_backlog(waiting, max(age, 0.0))

    async def fan_out(self, endpoints: Sequence[WebhookEndpointRecord]) -> int:
        """Turn log entries after the cursor into deliveries to `endpoints`, once: the cursor moves by a conditional
        update, so a replica that read the same entries meanwhile writes nothing. How many entries were read."""
        cursor = await self.repo.cursor()
        events = await self.outbox.after(cursor, limit=FAN_OUT_BATCH)
        if not events:
            return 0
        now = self.now()
        deliveries = [
            WebhookDeliveryRecord(
                id="whd_" + new_id(12),
                endpoint_id=endpoint.id,
                event_id=event.id or 0,
                elicitation_id=event.grant_id if isinstance(event, GrantEvent) else event.elicitation_id,
                body=webhook_body(event),
                status=DeliveryStatus.PENDING,
                attempts=0,
                next_attempt_at=now,
                claimed_by=None,
                lease_until=None,
                last_attempt_at=None,
                last_status_code=None,
                last_error=None,
                created_at=now,
                delivered_at=None,
            )
            for event in events
            for endpoint in endpoints
            if for_tenant(event, endpoint.tenant, self.sharing) and (event.id or 0) > endpoint.after_event_id
        ]
        moved = await self.repo.enqueue(deliveries, from_cursor=cursor, to_cursor=events[-1].id or cursor)
        return len(events) if moved else 0

    async def attempt(self, delivery: WebhookDeliveryRecord) -> None:
        """Make the attempt this replica claimed (its number is `delivery.attempts`) and record how it went."""
        endpoint = await self.repo.endpoint(delivery.endpoint_id)
        started = time.monotonic()
        if endpoint is None:
            return  # removed meanwhile: its deliveries went with it
        body = delivery.body.encode()
        signed_at = self.now()
        try:
            headers = signed_headers(
                self.endpoints.signing_secrets(endpoint, signed_at),
                str(delivery.event_id),
                int(signed_at.timestamp()),
                body,
            )
        except Exception as exc:  # a secret this vault cannot read (a retired key): retried, and logged
            log.warning("a webhook secret cannot be read: %s", type(exc).__name__, extra={"webhook_id": endpoint.id})
            result = AttemptResult(error="secret_unreadable")
        else:
            headers["Content-Type"] = "application/json"
            result = await self.sender.send(endpoint.url, headers, body)
        elapsed = time.monotonic() - started
        now = self.now()
        if result.delivered:
            status, next_at = DeliveryStatus.DELIVERED, None
        else:
            next_at = now + self.policy.backoff(delivery.attempts, self.rand)
            late = next_at > delivery.created_at + self.policy.max_age
            status, next_at = (DeliveryStatus.FAILED, None) if late else (DeliveryStatus.PENDING, next_at)
        attempt = AttemptRecord(
            delivery_id=delivery.id,
            attempt=delivery.attempts,
            replica_id=self.replica_id,
            at=now,
            status_code=result.status_code,
            error=result.error[:ERROR_TEXT_LIMIT] if result.error else None,
            duration_ms=int(elapsed * 1000),
        )
        settled = await self.repo.settle(
            delivery, replica_id=self.replica_id, status=status, next_attempt_at=next_at, attempt=attempt
        )
        if self.metrics is not None:
            self.metrics.webhook_attempt(status if settled else None, elapsed)
        if not settled:
            log.warning(
                "a webhook attempt outlived its lease; another replica took the delivery",
                extra={"webhook_id": endpoint.id, "delivery_id": delivery.id},
            )
        elif status is DeliveryStatus.FAILED:
            log.warning(
                "a webhook delivery gave up after %d attempts",
                delivery.attempts,
                extra={"webhook_id": endpoint.id, "delivery_id": delivery.id},
            )
