"""A webhook's signature as the Standard Webhooks specification has it (https://www.standardwebhooks.com): the
endpoint secret (`whsec_<base64>`), the signed headers a delivery carries (`webhook-id`, `webhook-timestamp`,
`webhook-signature: v1,<base64 HMAC-SHA256>`, several space-separated), and their check by a receiver. Any of the
specification's reference libraries verifies what `signed_headers` makes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SIGNATURE_VERSION = "v1"
ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
DEFAULT_TOLERANCE_SECONDS = 300


class WebhookVerificationError(ValueError):
    """A webhook request that must not be trusted: a missing header, a stale timestamp, no matching signature."""


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
    """`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` under the secret's key (the specification's form)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION}," + base64.b64encode(digest).decode("ascii")


def signed_headers(secret: str | Sequence[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers; with several secrets (during a secret rotation's overlap: the new one first), one
    signature each, space-separated in the one `webhook-signature` header."""
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
    """Check a webhook request and return its body: the envelope `{"type", "timestamp", "data"}`, `data` being
    the event as the event stream sends it.

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
        raise WebhookVerificationError("a webhook-id, webhook-timestamp or webhook-signature header is missing")
    timestamp = _fresh_timestamp(stamp, tolerance_seconds, time.time() if now is None else now)
    secrets_ = [secret] if isinstance(secret, str) else list(secret)
    expected = [signature(each, message_id, timestamp, body) for each in secrets_]
    if not _any_matches(given, expected):
        raise WebhookVerificationError("no webhook-signature matches the secret")
    try:
        event = json.loads(body)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return event


def _fresh_timestamp(stamp: str, tolerance_seconds: int, now: float) -> int:
    """The `webhook-timestamp` as unix seconds, if it is one and within `tolerance_seconds` of `now`."""
    if not stamp.isdigit() or len(stamp) > 12:
        raise WebhookVerificationError("the webhook-timestamp is not a unix time")
    timestamp = int(stamp)
    if abs(now - timestamp) > tolerance_seconds:
        raise WebhookVerificationError("the webhook-timestamp is too far from now (a replayed request?)")
    return timestamp


def _any_matches(given: str, expected: Sequence[str]) -> bool:
    """Whether any signature of the header (space-separated `v1,<base64>`) equals any expected one. Every pair is
    compared (in constant time), so the time taken does not tell which (or whether one) matched; a signature of
    another version matches nothing."""
    offered = given.split()
    matched = False
    for candidate in offered:
        for wanted in expected:
            matched |= hmac.compare_digest(candidate.encode(), wanted.encode())
    return matched
