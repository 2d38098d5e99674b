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
when the lease ends). Failed attempts are retried with exponential backoff and jitter until the delivery is
`max_age` old. At least once: a receiver may see an event twice (a lost answer), never a wrong one.

One module a job:
  signing.py    the secret, the signature and its headers, and `verify_webhook` for receivers
  payload.py    the JSON body of an event (the event stream sends the same)
  endpoints.py  the delivery policy and the registry of a tenant's endpoints (create, rotate a secret, sign with)
  dispatch.py   from the event log to deliveries, and each claimed attempt made and recorded
Where an endpoint may point is the URL rule's (`core/urls.py: webhook_url_problem`).
"""

from __future__ import annotations

from ..settings import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from .dispatch import NO_ENDPOINT_RECHECK, WebhookDispatcher
from .endpoints import WebhookEndpoints, WebhookPolicy
from .payload import event_body, event_payload, for_tenant
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
    "for_tenant",
    "signed_headers",
    "verify_webhook",
]
