"""Pooled HTTP to providers: one long-lived connection pool (keep-alive, one TLS context) per provider.

Token, revocation, userinfo, discovery and key requests use the provider's long-lived `httpx.AsyncClient`.
`api_client` gives `Connector.http()` a light client over the same pool: its `base_url` and `auth` are its own,
the connections and the TLS context are shared, closing it leaves the pool open, and a redirect it follows to another
origin goes without the headers that carry the grant's secret. `aclose` closes every pool.

The long-lived client has no auth, follows no redirect, keeps no cookie and has no event hook, so the layers of
`httpx.AsyncClient.send` for those (an auth flow, a redirect loop, the cookie jar parsing every answer) do nothing
for its requests but cost ~170 µs of CPU a call, two calls a connect flow: `_PooledClient.send` hands a request
straight to the pool, and goes through the client's `send` whenever a call or the environment asks for any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.request
import weakref
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx

from ..util.cookies import refusing_cookie_jar

# Options that configure a connection pool: the provider's pool is configured once, from `[providers]`.
_POOL_OPTIONS = frozenset({"verify", "cert", "http1", "http2", "limits", "proxy", "mounts", "trust_env"})


@dataclass(frozen=True, slots=True)
class HttpSettings:
    timeout_seconds: float = 30.0
    max_connections: int = 100
    max_keepalive_connections: int = 20
    keepalive_expiry_seconds: float = 30.0

    @property
    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_seconds)

    @property
    def limits(self) -> httpx.Limits:
        return httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_keepalive_connections,
            keepalive_expiry=self.keepalive_expiry_seconds,
        )


@dataclass(frozen=True, slots=True)
class _Taken:
    """What `_Secrets.take` found in a request: its URL without the secret parameters, and the items taken out."""

    url: httpx.URL
    headers: list[tuple[str, str]]
    parameters: list[tuple[str, str]]


class _Secrets:
    """Where a grant's auth writes its secret into a request: headers (`secret_headers`, any case) and query
    parameters (a credential entry's)."""

    __slots__ = ("headers", "parameters")

    def __init__(self, headers: Collection[str], parameters: Collection[str]) -> None:
        self.headers = frozenset(name.lower() for name in headers)
        self.parameters = tuple(parameters)

    def take(self, request: httpx.Request) -> _Taken | None:
        """The secret items of `request` and its URL without them (None when it holds none); `request` unchanged."""
        url = request.url
        parameters = [(name, value) for name in self.parameters if url.query for value in url.params.get_list(name)]
        headers = [(name, value) for name, value in request.headers.multi_items() if name in self.headers]
        if not parameters and not headers:
            return None
        for name in dict(parameters):
            url = url.copy_remove_param(name)
        return _Taken(url, headers, parameters)


class _ApiTransport(httpx.AsyncBaseTransport):
    """The transport of a client that carries a grant's secret to the provider's API. A request for another origin
    (a redirect followed: httpx keeps every header on it but Authorization) goes without the headers that carry it.
    What `hide` took out of a request (for the host's request hooks) is put back here, for the API's origin only.
    A provider's pool is lent (`lent`): closing the client does not close the pool."""

    def __init__(self, inner: httpx.AsyncBaseTransport, origin: httpx.URL, secrets: _Secrets, *, lent: bool) -> None:
        self._inner = inner
        self._home = (origin.scheme, origin.host, origin.port)
        self._secrets = secrets
        self._lent = lent
        self._hidden: weakref.WeakKeyDictionary[httpx.Request, _Taken] = weakref.WeakKeyDictionary()

    def hide(self, request: httpx.Request) -> None:
        """Take the secret out of `request` until it is sent (the host's request hooks see it without)."""
        taken = self._secrets.take(request)
        if taken is None:
            return
        request.url = taken.url
        for name in dict(taken.headers):
            del request.headers[name]
        self._hidden[request] = taken

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        hidden = self._hidden.pop(request, None)
        if (url.scheme, url.host, url.port) != self._home:
            for name in self._secrets.headers:
                request.headers.pop(name, None)
        elif hidden is not None:
            for name, value in hidden.headers:
                request.headers[name] = value
            for name, value in hidden.parameters:
                url = url.copy_add_param(name, value)
            request.url = url
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        if not self._lent:
            await self._inner.aclose()


class _ApiClient(httpx.AsyncClient):
    """A client whose auth writes a grant's secret into each request (`secret_headers`, the query parameters
    `secret_parameters`): what it hands to the host application (a response's `request`, those of its `history`, its
    `next_request`, an error's `request`) is a copy without them, so `raise_for_status()`'s message, a logged
    `response.request.url` or `.headers` show no token or key. The first response hook makes the copy: the auth flow
    and the redirect handling keep the request as sent (httpx builds a redirect from its own variable, not from
    `response.request`), and the host's own response hooks see the copy already. The host's request hooks run after
    the auth flow wrote the secret: the first request hook takes it out, the transport puts it back."""

    def __init__(self, *, secrets: _Secrets, transport: _ApiTransport, **kwargs: Any) -> None:
        self._secrets = secrets
        self._api_transport = transport
        super().__init__(transport=transport, **kwargs)
        self.event_hooks = self._event_hooks

    @property
    def event_hooks(self) -> dict[str, list[Any]]:
        return self._event_hooks

    @event_hooks.setter
    def event_hooks(self, event_hooks: Mapping[str, list[Any]]) -> None:
        requests = [hook for hook in event_hooks.get("request", []) if hook != self._hide_request]
        responses = [hook for hook in event_hooks.get("response", []) if hook != self._redact_response]
        self._event_hooks = {
            "request": [self._hide_request, *requests],
            "response": [self._redact_response, *responses],
        }

    async def _hide_request(self, request: httpx.Request) -> None:
        if len(self._event_hooks["request"]) > 1:  # only the host's hooks would see it
            self._api_transport.hide(request)

    async def _redact_response(self, response: httpx.Response) -> None:
        response.request = self._redacted(response.request)

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        try:
            response = await super().send(request, **kwargs)
        except httpx.HTTPError as exc:  # httpx's docs log `exc.request.url`
            with contextlib.suppress(RuntimeError):  # an error without a request
                exc.request = self._redacted(exc.request)
            raise
        if response.next_request is not None:  # a redirect not followed: the request httpx would send next
            response.next_request = self._redacted(response.next_request)
        return response

    def _redacted(self, request: httpx.Request) -> httpx.Request:
        """`request` without the secret headers and query parameters (`request` itself when it has none)."""
        taken = self._secrets.take(request)
        if taken is None:
            return request
        secret = self._secrets.headers
        headers = httpx.Headers(
            [(name, value) for name, value in request.headers.raw if name.decode("latin-1").lower() not in secret],
            encoding=request.headers.encoding,
        )
        copy = httpx.Request(
            request.method, taken.url, headers=headers, stream=request.stream, extensions=request.extensions
        )
        if isinstance(request.stream, httpx.ByteStream):
            copy.read()  # its `content`, as the request's
        return copy


class AnswerTooLarge(Exception):
    """An answer's body read whole (a 401's, before a refresh) passed its size limit."""


class _CappedStream(httpx.AsyncByteStream):
    """`inner`, ending in AnswerTooLarge past `limit` bytes (as received, before any content decoding)."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._inner:
            size += len(chunk)
            if size > self._limit:
                raise AnswerTooLarge(f"an answer's body over {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RequestLinesWithoutQueries(logging.Filter):
    """httpx logs each request's URL at INFO, after the auth flow wrote into it: a credential entry injected as a
    query parameter (Pipedrive's api_token) would put a key in the host application's log. The query goes; the line
    stays (as in the connector's own access log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], httpx.URL) and args[1].query:
            record.args = (args[0], args[1].copy_with(query=None), *args[2:])
        return True


def _httpx_request_lines_without_queries() -> None:
    httpx_log = logging.getLogger("httpx")
    if not any(isinstance(f, _RequestLinesWithoutQueries) for f in httpx_log.filters):
        httpx_log.addFilter(_RequestLinesWithoutQueries())


class _PooledClient(httpx.AsyncClient):
    """A provider's long-lived client (no auth, no redirects followed, no cookies kept, no event hooks) whose `send`
    hands the request straight to its pool: what `AsyncClient.send` would do with it, without the layers that do
    nothing here (and without `next_request`, the redirect not followed, which nothing reads)."""

    def __init__(self, pool: httpx.AsyncBaseTransport, **kwargs: Any) -> None:
        super().__init__(transport=pool, **kwargs)
        # Proxies from the environment mount transports of their own: those requests take the client's way.
        self._direct = None if urllib.request.getproxies() else pool

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = httpx.USE_CLIENT_DEFAULT,
        follow_redirects: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        hooks = self.event_hooks
        if (
            self._direct is None
            or stream
            or auth is not httpx.USE_CLIENT_DEFAULT
            or follow_redirects is not httpx.USE_CLIENT_DEFAULT
            or self.auth is not None
            or self.follow_redirects
            or self.is_closed
            or request.url.userinfo  # credentials in the URL: the client's way makes them Basic auth
            or hooks["request"]
            or hooks["response"]
        ):
            return await super().send(request, stream=stream, auth=auth, follow_redirects=follow_redirects)
        if "timeout" not in request.extensions:
            request.extensions = {**request.extensions, "timeout": self.timeout.as_dict()}
        started = time.perf_counter()
        try:
            response = await self._direct.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        try:
            await response.aread()
        except BaseException:
            await response.aclose()
            raise
        response.elapsed = timedelta(seconds=time.perf_counter() - started)
        return response


class ProviderHttp:
    """The connection pools, by provider name; each is opened at first use."""

    def __init__(self, settings: HttpSettings | None = None) -> None:
        self.settings = settings or HttpSettings()
        _httpx_request_lines_without_queries()  # the embedded connector's logging is the host application's
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._pools: dict[str, httpx.AsyncBaseTransport] = {}
        self.clients_created = 0  # pools opened since start (the benchmark reports it)

    def client(self, name: str) -> httpx.AsyncClient:
        """The provider's long-lived client (created on first use)."""
        client = self._clients.get(name)
        if client is None:
            pool = httpx.AsyncHTTPTransport(limits=self.settings.limits)
            # Shared by every user of the provider: it keeps no cookies (`refusing_cookie_jar`).
            client = _PooledClient(pool, timeout=self.settings.timeout, cookies=refusing_cookie_jar())
            self._pools[name] = pool
            self._clients[name] = client
            self.clients_created += 1
        return client

    def api_client(
        self,
        name: str,
        *,
        base_url: str,
        auth: httpx.Auth,
        secret_headers: Collection[str],
        secret_parameters: Collection[str] = (),
        client_kwargs: Mapping[str, Any],
    ) -> httpx.AsyncClient:
        """A client for one use of the provider's API, over the provider's pool (close it when done). `auth` writes
        the grant's secret into `secret_headers` (and the query parameters `secret_parameters`): a redirect followed
        to another origin than `base_url`'s goes without the headers, and the requests the client hands back
        (`response.request`, ...) are copies without either."""
        refused = _POOL_OPTIONS.intersection(client_kwargs)
        if refused:
            raise TypeError(
                f"{', '.join(sorted(refused))}: the provider's connection pool is shared and configured once "
                "([providers] http_* settings)"
            )
        kwargs = dict(client_kwargs)
        given = kwargs.pop("transport", None)
        if given is None:
            self.client(name)
        inner = self._pools[name] if given is None else given
        secrets = _Secrets(secret_headers, secret_parameters)
        transport = _ApiTransport(inner, httpx.URL(base_url), secrets, lent=given is None)
        kwargs.setdefault("timeout", self.settings.timeout)
        return _ApiClient(secrets=secrets, base_url=base_url, auth=auth, transport=transport, **kwargs)

    async def send_bare(
        self, name: str, request: httpx.Request, auth: httpx.Auth, *, deadline: float, max_401_bytes: int
    ) -> httpx.Response:
        """`request` as it is, on the provider's pool through `auth`'s flow, without the client layer (the token
        proxy relays the agent's request): no client default headers, no cookie jar, no redirect followed. The
        response streams: read or close it.

        Sending the request and receiving the answer's headers (and a 401's body, which the flow reads) end by
        `deadline` (the event loop's clock), else TimeoutError: each read and write has its own timeout, but a peer
        that trickles (an upload, a status line) would pass every one of them. What `auth` does in between (a
        refresh) is not cut short. A 401's body (read whole) over `max_401_bytes` raises AnswerTooLarge."""
        self.client(name)
        pool = self._pools[name]
        flow = auth.async_auth_flow(request)
        try:
            request = await flow.__anext__()
            while True:
                async with asyncio.timeout_at(deadline):
                    response = await pool.handle_async_request(request)
                response.request = request
                try:
                    if response.status_code == 401:  # the flow reads it (before a refresh): within the deadline
                        stream = response.stream
                        assert isinstance(stream, httpx.AsyncByteStream)
                        response.stream = _CappedStream(stream, max_401_bytes)  # and within a size
                        async with asyncio.timeout_at(deadline):
                            await response.aread()
                    try:
                        request = await flow.asend(response)
                    except StopAsyncIteration:
                        return response
                    await response.aread()  # the answer the flow will not return (a 401 before a retry)
                except BaseException:
                    await response.aclose()
                    raise
        finally:
            await flow.aclose()

    async def aclose(self) -> None:
        clients, self._clients, self._pools = list(self._clients.values()), {}, {}
        for client in clients:
            await client.aclose()
