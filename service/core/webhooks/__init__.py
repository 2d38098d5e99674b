"""Signed webhooks: the `/v1` events delivered by HTTP POST to an agent's endpoint, for agents that cannot hold a
stream.

Exactly the Standard Webhooks specification (https://www.standardwebhooks.com), so its reference libraries verify
every delivery. The body is the specification's envelope around what the event stream sends for one event of the
durable event log (ids and statuses, never a secret):

    {"type": "grant.revoked" | "elicitation.completed" | ..., "timestamp": "<ISO 8601, when logged>", "data": {...}}

with three headers:

    webhook-id: <the event's id in the log, as in SSE `id:`; the same for every attempt: deduplicate on it>
    webhook-timestamp: <unix seconds of this attempt>
    webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>", keyed by the secret's base64 bytes>

Each endpoint belongs to a tenant (an API key's agent) and has its own secret (`whsec_<base64 of 32 bytes>`), shown
once when it is made and kept encrypted by the vault. A secret rotation (`rotate_secret`) makes a new one, shown once
too, and keeps the one it replaces signing for an overlap: meanwhile `webhook-signature` holds both signatures,
space-separated, the new one first (`v1,<new> v1,<old>`), so a receiver verifies with either secret and switches
when it likes.

Delivery is driven from the event log, so it survives restarts and works across replicas: a fan-out step turns new
log entries into delivery rows (the cursor moves by a conditional update, so one replica does it once), and each
attempt is taken by one replica by a conditional update (a lease; an attempt whose replica vanished is taken again
when the lease ends). Failed attempts are retried with exponential backoff and jitter until the delivery is
`max_age` old. At least once: a receiver may see an event twice (a lost answer), never a wrong one.

One module a job:
  signing.py    the secret, the signature and its headers, and `verify_webhook` for receivers
  payload.py    the JSON of an event (the event stream's data) and the webhook envelope around it
  endpoints.py  the delivery policy and the registry of a tenant's endpoints (create, rotate a secret, sign with)
  dispatch.py   from the event log to deliveries, and each claimed attempt made and recorded
Where an endpoint may point is the URL rule's (`core/urls.py: webhook_url_problem`).
"""

from __future__ import annotations

from ..settings import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from .dispatch import NO_ENDPOINT_RECHECK, WebhookDispatcher
from .endpoints import WebhookEndpoints, WebhookPolicy
from .payload import event_body, event_payload, event_type, for_tenant, webhook_body
from .signing import WebhookVerificationError, signed_headers, verify_webhook

__all__ = [
    "DEFAULT_SECRET_OVERLAP",
    "MAX_SECRET_OVERLAP",
    "NO_ENDPOINT_RECHECK",
    "WebhookDispatcher",
    "WebhookEndpoints",
    "WebhookPolicy",
    "WebhookVerificationError",
    "event_body",
    "event_payload",
    "event_type",
    "for_tenant",
    "signed_headers",
    "verify_webhook",
    "webhook_body",
]
