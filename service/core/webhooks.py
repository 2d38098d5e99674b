"""Signed webhooks: the `/v1` events delivered by HTTP POST to an agent's endpoint, for agents that cannot hold a
stream.

What is sent is what the event stream sends: one event of the durable event log (ids and statuses, never a secret)
as JSON, with three headers (the Standard Webhooks layout):

    Webhook-Id: <the event's id in the log, as in SSE `id:`; the same for every attempt: deduplicate on it>
    Webhook-Timestamp: <unix seconds of this attempt>
    Webhook-Signature: v1=<hex HMAC-SHA256, keyed by the endpoint's secret, of "<id>.<timestamp>.<body>">

Each endpoint belongs to a tenant (an API key's agent) and has its own secret (`whsec_...`), shown once when it is
made and kept encrypted by the vault. A secret rotation (`rotate_secret`) makes a new one, shown once too, and keeps
the one it replaces signing for an overlap: meanwhile `Webhook-Signature` holds both signatures, the new one first
(`v1=<new> v1=<old>`), so a receiver verifies with either secret and switches when it likes.

Delivery is driven from the event log, so it survives restarts and works across replicas: a fan-out step turns new
log entries into delivery rows (the cursor moves by a conditional update, so one replica does it once), and each
attempt is taken by one replica by a conditional update (a lease; an attempt whose replica vanished is taken again
when the lease ends). Failed attempts are retried with exponential
backoff and jitter until the delivery is `max_age` old. At least once: a receiver may see an event twice (a lost
answer), never a wrong one.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from .agent_api import tenant_of
from .events import ElicitationEvent
from .handles import new_id
from .outcomes import TERMINAL_OUTCOMES
from .ports import OutboxRepo, Vault, WebhookMetrics, WebhookRepo, WebhookSender
from .records import AttemptRecord, AttemptResult, WebhookDeliveryRecord, WebhookEndpointRecord
from .states import DeliveryStatus

log = logging.getLogger("service.webhooks")

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SIGNATURE_VERSION = "v1"
ID_HEADER = "Webhook-Id"
TIMESTAMP_HEADER = "Webhook-Timestamp"
SIGNATURE_HEADER = "Webhook-Signature"
DEFAULT_TOLERANCE_SECONDS = 300
MAX_ENDPOINTS_PER_TENANT = 10
MAX_URL_LENGTH = 2048
# How long a rotated-out secret keeps signing alongside the new one, unless the rotation says otherwise.
DEFAULT_SECRET_OVERLAP = timedelta(hours=24)
MAX_SECRET_OVERLAP = timedelta(days=7)
ROTATION_ATTEMPTS = 5  # a secret rotation racing a key rotation (or another rotation) reads the row again
FAN_OUT_BATCH = 500
CLAIM_BATCH = 20
# How long a replica believes a read that found no endpoint at all (one registered in this process ends it at once).
NO_ENDPOINT_RECHECK = timedelta(seconds=30)
ERROR_TEXT_LIMIT = 120


class WebhookVerificationError(ValueError):
    """A webhook request that must not be trusted: a missing header, a stale timestamp, no matching signature."""


# -- the secret and the signature ---------------------------------------------------------------------------


def new_secret() -> str:
    """A new endpoint secret: `whsec_` and 32 random bytes, base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key a secret stands for. Raises ValueError for anything that is not a `whsec_` secret."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError:
        raise ValueError("a webhook secret is whsec_ and base64") from None
    if len(key) < 16:
        raise ValueError("a webhook secret holds at least 16 bytes")
    return key


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1=<hex HMAC-SHA256 of "<id>.<timestamp>.<body>">` under the secret."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return f"{SIGNATURE_VERSION}=" + hmac.new(secret_key(secret), signed, hashlib.sha256).hexdigest()


def signed_headers(secret: str | Sequence[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers; with several secrets (during a secret rotation's overlap: the new one first), one
    signature each, space-separated in the one `Webhook-Signature` header."""
    secrets_ = [secret] if isinstance(secret, str) else list(secret)
    return {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(signature(each, message_id, timestamp, body) for each in secrets_),
    }


def verify_webhook(
    secret: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a webhook request and return its event (the JSON body).

    `headers` may be any mapping (names are compared case-insensitively); `body` is the raw bytes as received.
    `secret` may be several (while an endpoint's secret is replaced, accept the old and the new one). Raises
    `WebhookVerificationError` when a header is missing, the timestamp is more than `tolerance_seconds` from now
    (a replayed request), or no signature matches (compared in constant time).
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    message_id = lowered.get(ID_HEADER.lower())
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    if not message_id or not stamp or not given:
        raise WebhookVerificationError("a Webhook-Id, Webhook-Timestamp or Webhook-Signature header is missing")
    if not stamp.isdigit() or len(stamp) > 12:
        raise WebhookVerificationError("the Webhook-Timestamp is not a unix time")
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise WebhookVerificationError("the Webhook-Timestamp is too far from now (a replayed request?)")
    secrets_ = [secret] if isinstance(secret, str) else list(secret)
    expected = [signature(each, message_id, timestamp, body) for each in secrets_]
    offered = [part.strip() for part in given.replace(",", " ").split() if part.strip()]
    matched = False
    for candidate in offered:
        for wanted in expected:
            # Every pair is compared, so the time taken does not tell which (or whether one) matched.
            matched |= hmac.compare_digest(candidate.encode(), wanted.encode())
    if not matched:
        raise WebhookVerificationError("no Webhook-Signature matches the secret")
    try:
        event = json.loads(body)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return event


# -- what is sent --------------------------------------------------------------------------------------------


def event_payload(event: ElicitationEvent) -> dict[str, Any]:
    """The one JSON form of a logged event, for the event stream and for webhooks alike (`models.Event`)."""
    return {
        "id": event.id or 0,
        "elicitationId": event.elicitation_id,
        "status": event.status.value,
        "outcome": (outcome.value if (outcome := TERMINAL_OUTCOMES.get(event.status)) is not None else None),
        "connectionId": connection_id_of(event.connection_key),
    }


def connection_id_of(connection_key: str) -> str | None:
    """The agent's own label of an API elicitation's connection (None for none, or an embedded connection)."""
    parts = connection_key.split(":", 2)
    return parts[2] or None if len(parts) == 3 and parts[0] == "v1" else None


def event_body(event: ElicitationEvent) -> str:
    return json.dumps(event_payload(event), separators=(",", ":"))


# -- where it may go -----------------------------------------------------------------------------------------


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why `url` may not be a webhook endpoint, or None. https only (http only to a loopback host, and only when
    private addresses are allowed); no credentials, fragment or odd port; an IP literal must be public unless
    private addresses are allowed. Host names are checked again, by address, before every attempt."""
    if len(url) > MAX_URL_LENGTH or not url.isascii() or not url.isprintable() or " " in url:
        return f"the URL must be at most {MAX_URL_LENGTH} printable ASCII characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "the URL cannot be read"
    host = parts.hostname
    if parts.scheme not in ("https", "http") or not host:
        return "the URL must be https://host/..."
    if parts.username is not None or parts.password is not None:
        return "the URL must not carry credentials"
    if parts.fragment:
        return "the URL must not have a fragment"
    if port == 0:
        return "the URL's port is not valid"
    loopback = host == "localhost" or _is_loopback_literal(host)
    if parts.scheme == "http" and not (loopback and allow_private):
        return "the URL must be https (http only to a loopback address, where webhooks.allow_private_addresses is on)"
    if loopback and not allow_private:
        return "the URL points to this host (webhooks.allow_private_addresses is off)"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if not allow_private and not address_allowed(address):
        return "the URL points to a private or reserved address (webhooks.allow_private_addresses is off)"
    return None


def _is_loopback_literal(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def address_allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a webhook may connect to `address` when private addresses are not allowed: global unicast only."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    allow_private_addresses: bool = False
    timeout: timedelta = timedelta(seconds=10)
    retry_initial: timedelta = timedelta(seconds=5)
    retry_max: timedelta = timedelta(hours=1)
    max_age: timedelta = timedelta(days=1)

    @property
    def lease(self) -> timedelta:
        """How long a replica holds an attempt: its timeout and a margin (then another replica may take it)."""
        return self.timeout * 2 + timedelta(seconds=5)

    def backoff(self, attempts: int, rand: Callable[[], float] = random.random) -> timedelta:
        """The wait after `attempts` failed attempts: doubling from `retry_initial` up to `retry_max`, of which a
        random part (up to half) is left out, so that receivers coming back are not hit all at once."""
        base: timedelta = min(self.retry_initial * (2 ** min(attempts - 1, 30)), self.retry_max)
        return base * (0.5 + 0.5 * rand())


# -- managing endpoints --------------------------------------------------------------------------------------


def secret_aad(endpoint_id: str, tenant: str) -> bytes:
    return json.dumps(["connector/webhook-secret/v1", endpoint_id, tenant], separators=(",", ":")).encode()


class WebhookEndpoints:
    """Registering, listing and removing a tenant's endpoints (the API and the CLI both use this)."""

    def __init__(
        self,
        repo: WebhookRepo,
        outbox: OutboxRepo,
        vault: Vault,
        policy: WebhookPolicy,
        clock: Callable[[], datetime],
    ) -> None:
        self.repo = repo
        self.outbox = outbox
        self.vault = vault
        self.policy = policy
        self.now = clock
        self.registered_here = 0  # endpoints this process registered: a dispatcher here notices them at once

    async def create(self, tenant: str, url: str, description: str | None) -> tuple[WebhookEndpointRecord, str]:
        """A new endpoint and its secret (returned this once, stored only encrypted). Raises ValueError with a
        sentence when the URL may not be used, LookupError when the tenant has its most endpoints already."""
        problem = url_problem(url, allow_private=self.policy.allow_private_addresses)
        if problem is not None:
            raise ValueError(problem)
        if len(await self.repo.endpoints(tenant)) >= MAX_ENDPOINTS_PER_TENANT:
            raise LookupError(f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints")
        endpoint_id = "wh_" + new_id(12)
        secret = new_secret()
        key_id, blob = self.vault.encrypt(secret.encode(), aad=secret_aad(endpoint_id, tenant))
        record = WebhookEndpointRecord(
            id=endpoint_id,
            tenant=tenant,
            url=url,
            description=description,
            secret_key_id=key_id,
            secret_ciphertext=blob,
            after_event_id=await self.outbox.last_id(),
            created_at=self.now(),
        )
        await self.repo.insert_endpoint(record)
        self.registered_here += 1
        return record, secret

    async def rotate_secret(
        self, endpoint: WebhookEndpointRecord, overlap: timedelta = DEFAULT_SECRET_OVERLAP
    ) -> tuple[WebhookEndpointRecord, str]:
        """Give an endpoint a new secret (returned this once, stored only encrypted) and keep the current one
        signing alongside it for `overlap` (none with zero): receivers switch secrets without a rejected delivery.
        A previous secret still in its overlap is dropped (only one previous secret is kept). Raises ValueError
        for an overlap out of range, LookupError when the endpoint is gone."""
        if not timedelta(0) <= overlap <= MAX_SECRET_OVERLAP:
            raise ValueError(f"the overlap is between 0 and {int(MAX_SECRET_OVERLAP.total_seconds())} seconds")
        secret = new_secret()
        aad = secret_aad(endpoint.id, endpoint.tenant)
        key_id, blob = self.vault.encrypt(secret.encode(), aad=aad)
        current: WebhookEndpointRecord | None = endpoint
        for _ in range(ROTATION_ATTEMPTS):
            if current is None:
                break
            now = self.now()
            expires = now + overlap if overlap > timedelta(0) else None
            # The current ciphertext moves as it is: the same associated data binds both secrets to the endpoint.
            if await self.repo.replace_secret(
                current.id,
                old_key_id=current.secret_key_id,
                old_ciphertext=current.secret_ciphertext,
                new_key_id=key_id,
                new_ciphertext=blob,
                previous_expires_at=expires,
            ):
                kept = expires is not None
                rotated = dataclasses.replace(
                    current,
                    secret_key_id=key_id,
                    secret_ciphertext=blob,
                    previous_secret_key_id=current.secret_key_id if kept else None,
                    previous_secret_ciphertext=current.secret_ciphertext if kept else None,
                    previous_secret_expires_at=expires,
                )
                return rotated, secret
            current = await self.repo.endpoint(current.id)  # changed meanwhile: read it again
        raise LookupError("the webhook endpoint is gone, or its secret keeps changing")

    def secret_of(self, endpoint: WebhookEndpointRecord) -> str:
        aad = secret_aad(endpoint.id, endpoint.tenant)
        return self.vault.decrypt(endpoint.secret_key_id, endpoint.secret_ciphertext, aad=aad).decode()

    def signing_secrets(self, endpoint: WebhookEndpointRecord, now: datetime) -> list[str]:
        """The secrets a delivery at `now` is signed with: the current one, then the previous one while its
        overlap lasts (checked here, at signing time: an expired one left in the row signs nothing)."""
        found = [self.secret_of(endpoint)]
        if endpoint.previous_secret_live(now):
            assert endpoint.previous_secret_key_id is not None and endpoint.previous_secret_ciphertext is not None
            aad = secret_aad(endpoint.id, endpoint.tenant)
            previous = self.vault.decrypt(endpoint.previous_secret_key_id, endpoint.previous_secret_ciphertext, aad=aad)
            found.append(previous.decode())
        return found


# -- delivering ----------------------------------------------------------------------------------------------


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
    ) -> None:
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
        by_tenant: dict[str, list[WebhookEndpointRecord]] = {}
        for endpoint in endpoints:
            by_tenant.setdefault(endpoint.tenant, []).append(endpoint)
        now = self.now()
        deliveries = [
            WebhookDeliveryRecord(
                id="whd_" + new_id(12),
                endpoint_id=endpoint.id,
                event_id=event.id or 0,
                elicitation_id=event.elicitation_id,
                body=event_body(event),
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
            for endpoint in by_tenant.get(tenant_of(event.connection_key) or "", ())
            if (event.id or 0) > endpoint.after_event_id
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
