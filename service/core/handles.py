"""Opaque handles and what the server keeps of them: random ids, salted hashes, and the vault's associated data.

Anything that leaves the server (a state, a flow id, a cookie value) is stored only as a hash made here, and
every ciphertext is bound to its row by associated data made here, so one rule never lives twice.
"""

from __future__ import annotations

import hashlib
import json
import secrets


def new_id(nbytes: int = 24) -> str:
    """An unguessable URL-safe id (`nbytes` random bytes; 24 gives 192 bits)."""
    return secrets.token_urlsafe(nbytes)


def _digest(purpose: str, value: str) -> str:
    return hashlib.sha256(purpose.encode() + b"\x00" + value.encode()).hexdigest()


def binding_hash(browser_binding: str) -> str:
    """The stored form of the browser-binding cookie."""
    return _digest("browser-binding", browser_binding)


def state_hash(state: str) -> str:
    """The stored form of an OAuth `state`."""
    return _digest("oauth-state", state)


def handle_hash(purpose: str, handle: str) -> str:
    """The stored form of an identity verifier's handle (its state, flow id or return code)."""
    return _digest(f"identity-{purpose}", handle)


def _aad(*parts: str) -> bytes:
    # A JSON array is an unambiguous encoding: no choice of field values makes two different tuples collide.
    return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def grant_aad(issuer: str, subject: str, provider: str, account_id: str) -> bytes:
    """Associated data binding a grant's token ciphertext to its unique key (user, provider, account)."""
    return _aad("connector/grant/v1", issuer, subject, provider, account_id)


def flow_aad(flow_id: str) -> bytes:
    """Associated data binding an OAuth flow's secret (the PKCE verifier) to that flow."""
    return _aad("connector/flow/v1", flow_id)


def verification_aad(verification_id: str) -> bytes:
    """Associated data binding an identity verification's secret (its PKCE verifier) to that verification."""
    return _aad("connector/identity-verification/v1", verification_id)


def webhook_secret_aad(endpoint_id: str, tenant: str) -> bytes:
    """Associated data binding a webhook endpoint's secret (current or previous) to that endpoint and its tenant."""
    return _aad("connector/webhook-secret/v1", endpoint_id, tenant)


def api_key_hash(key: str) -> str:
    """The stored form of a `/v1` API key."""
    return _digest("api-key", key)
