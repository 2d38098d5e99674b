"""Webhook delivery in this process: the HTTP sender, and the task that runs the dispatcher's steps.

The sender resolves the endpoint's host itself and, unless private addresses are allowed, refuses when any address
it resolves to is not public, then connects to the address it checked (the `Host` header and TLS server name stay
the endpoint's host), so a name that changes its answer between the check and the connection (DNS rebinding)
cannot reach an internal service. It follows no redirect, sends no proxy-environment settings, bounds every attempt
by `timeout`, and never reads the answer's body.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping

import httpx

from service.core.events import ElicitationEvent, Event
from service.core.records import AttemptResult
from service.core.urls import is_public_address, webhook_url_problem
from service.core.webhooks import WebhookDispatcher
from service.util.cookies import refusing_cookie_jar

from .bus import LocalBus

log = logging.getLogger("service.webhooks")

Resolver = Callable[[str, int], Awaitable[list[str]]]
MAX_BACKOFF_SECONDS = 60.0


async def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (an IP literal resolves to itself)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class HttpWebhookSender:
    def __init__(self, *, timeout: float, allow_private: bool, resolver: Resolver = resolve) -> None:
        self.timeout = timeout
        self.allow_private = allow_private
        self._resolve = resolver
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_connections=50, max_keepalive_connections=10),
            cookies=refusing_cookie_jar(),  # shared by every tenant's endpoints
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(self, url: str, headers: Mapping[str, str], body: bytes) -> AttemptResult:
        if webhook_url_problem(url, allow_private=self.allow_private) is not None:
            return AttemptResult(error="url_refused")
        target = httpx.URL(url)
        host, port = target.host, target.port or (443 if target.scheme == "https" else 80)
        try:
            async with asyncio.timeout(self.timeout):
                addresses = await self._resolve(host, port)
        except (OSError, TimeoutError):
            return AttemptResult(error="name_not_resolved")
        parsed = [ipaddress.ip_address(a.split("%")[0]) for a in addresses]
        if not parsed:
            return AttemptResult(error="name_not_resolved")
        if not self.allow_private and not all(is_public_address(a) for a in parsed):
            return AttemptResult(error="address_refused")
        sent_headers = {**headers, "Host": target.netloc.decode("ascii"), "User-Agent": "acp-connector-webhooks"}
        extensions = {"sni_hostname": host} if target.scheme == "https" else {}
        request = self._client.build_request(
            "POST", target.copy_with(host=str(parsed[0])), content=body, headers=sent_headers, extensions=extensions
        )
        try:
            async with asyncio.timeout(self.timeout):
                response = await self._client.send(request, stream=True)
                await response.aclose()  # the answer's body is never read
        except (TimeoutError, httpx.TimeoutException):
            return AttemptResult(error="timeout")
        except httpx.ConnectError:
            return AttemptResult(error="connect_failed")
        except httpx.HTTPError as exc:
            return AttemptResult(error=f"http_error:{type(exc).__name__}")
        error = "redirect_not_followed" if 300 <= response.status_code < 400 else None
        return AttemptResult(status_code=response.status_code, error=error)


class WebhookWorker:
    """The one task per process that delivers: a step when this process logs an event, and every `interval`
    (retries that fell due, events other replicas logged); and, at most once per `interval`, the backlog metrics."""

    def __init__(self, dispatcher: WebhookDispatcher, bus: LocalBus, sender: HttpWebhookSender, *, interval: float):
        self.dispatcher = dispatcher
        self.bus = bus
        self.sender = sender
        self.interval = interval
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _heard(self, event: Event) -> None:
        if isinstance(event, ElicitationEvent):
            self._wake.set()

    async def start(self) -> None:
        self.bus.add_listener(self._heard)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="connector-webhooks")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self.bus.remove_listener(self._heard)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.sender.aclose()

    async def _run(self) -> None:
        failures = 0
        reported: float | None = None  # when the backlog was last read (monotonic)
        while True:
            delay = self.interval if failures == 0 else min(self.interval * 2 ** min(failures, 10), MAX_BACKOFF_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            try:
                await self.dispatcher.step()
                # Once per interval however often events wake the loop: one aggregate read, not one per event.
                if reported is None or time.monotonic() - reported >= self.interval:
                    reported = time.monotonic()
                    await self.dispatcher.report_backlog()
            except Exception as exc:  # a database outage: logged, tried again with backoff
                failures += 1
                log.warning("webhook delivery step failed: %s", type(exc).__name__)
            else:
                failures = 0
