"""A tenant's webhook endpoints: the delivery policy, and registering, rotating and reading their secrets."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..handles import new_id, webhook_secret_aad
from ..ports import OutboxRepo, Vault, WebhookRepo
from ..records import WebhookEndpointRecord
from ..settings import DEFAULT_SECRET_OVERLAP, MAX_SECRET_OVERLAP
from ..urls import webhook_url_problem
from .signing import new_secret

MAX_ENDPOINTS_PER_TENANT = 10
ROTATION_ATTEMPTS = 5  # a secret rotation racing a key rotation (or another rotation) reads the row again


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
        problem = webhook_url_problem(url, allow_private=self.policy.allow_private_addresses)
        if problem is not None:
            raise ValueError(problem)
        if len(await self.repo.endpoints(tenant)) >= MAX_ENDPOINTS_PER_TENANT:
            raise LookupError(f"a tenant has at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints")
        endpoint_id = "wh_" + new_id(12)
        secret = new_secret()
        key_id, blob = self.vault.encrypt(secret.encode(), aad=webhook_secret_aad(endpoint_id, tenant))
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
        aad = webhook_secret_aad(endpoint.id, endpoint.tenant)
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
        aad = webhook_secret_aad(endpoint.id, endpoint.tenant)
        return self.vault.decrypt(endpoint.secret_key_id, endpoint.secret_ciphertext, aad=aad).decode()

    def signing_secrets(self, endpoint: WebhookEndpointRecord, now: datetime) -> list[str]:
        """The secrets a delivery at `now` is signed with: the current one, then the previous one while its
        overlap lasts (checked here, at signing time: an expired one left in the row signs nothing)."""
        found = [self.secret_of(endpoint)]
        if endpoint.previous_secret_live(now):
            assert endpoint.previous_secret_key_id is not None and endpoint.previous_secret_ciphertext is not None
            aad = webhook_secret_aad(endpoint.id, endpoint.tenant)
            previous = self.vault.decrypt(endpoint.previous_secret_key_id, endpoint.previous_secret_ciphertext, aad=aad)
            found.append(previous.decode())
        return found
