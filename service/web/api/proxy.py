"""`/v1/proxy/{provider}/{path}`: the agent calls a provider's API with the user's token injected here.

The token is added by `GrantAuth` (refreshed ahead of expiry; one refresh and one retry after a 401 when the
request body can be sent again). Bodies stream both ways (an answer that declares at most SMALL_RESPONSE_BYTES is
read whole, then sent); the agent's own `Authorization`, cookies, our
`Connector-*` headers and hop-by-hop headers never reach the provider; the target is always under the provider's
API base URL (a path that would leave it is refused before anything is sent).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import AsyncIterator
from urllib.parse import unquote

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from service.config import ApiSettings
from service.core.agent_api import AgentApi
from service.core.errors import (
    ConnectorError,
    FlowRefused,
    GrantNeedsUser,
    NotAuthorized,
    ProviderError,
    ProviderUnavailable,
)
from service.core.identity import Identity
from service.core.records import GrantRecord
from service.oauth import ProviderGateway, ResolvedProvider
from service.tokens import TokenAccess, api_origin, grant_auth
from service.version import __version__

from ..inputs import read_body
from .io import caller, identity_of

log = logging.getLogger("service.web")

PREFIX = "/v1/proxy/"
USER_ISSUER = "connector-user-issuer"
USER_SUBJECT = "connector-user-subject"
USER_AGENT = f"acp-connector/{__version__}"
# RFC 9110 section 7.6.1, and what only this hop may see.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {"authorization", "cookie", "content-length", "expect"}
# The server writes its own Date on every response; a second one would make the field invalid (RFC 9110 5.3, 6.6.1).
NOT_RETURNED = HOP_BY_HOP | {"set-cookie", "www-authenticate", "date"}
_UNSAFE_PATH = re.compile(r"(^|/)\.\.?(/|$)|\\|[\x00-\x1f\x7f]")
# A response that declares at most this many bytes is read whole and sent as one body: streaming it would cost a
# task (and a task group) per response, more than the whole of a small API answer.
SMALL_RESPONSE_BYTES = 64 * 1024


@functools.lru_cache(maxsize=64)
def _api_base(base: str) -> tuple[httpx.URL, str]:
    """The provider's API base parsed once, and its path as a prefix ending in "/"."""
    origin = api_origin(base)
    return origin, origin.raw_path.decode("ascii").rstrip("/") + "/"


def target_url(base: str, raw_path: str, query: bytes) -> httpx.URL:
    """`raw_path` (as sent, percent-encoded) under `base`; FlowRefused `proxy_path_refused` if it could leave it."""
    decoded = unquote(raw_path)
    if _UNSAFE_PATH.search(decoded) or decoded.startswith("/") or "//" in decoded or "?" in decoded or "#" in decoded:
        raise FlowRefused("proxy_path_refused")
    origin, prefix = _api_base(base)
    url = origin.copy_with(raw_path=(prefix + raw_path).encode("ascii") + (b"?" + query if query else b""))
    if (url.scheme, url.host, url.port) != (origin.scheme, origin.host, origin.port) or not url.path.startswith(
        unquote(prefix)
    ):
        raise FlowRefused("proxy_path_refused")
    return url


class ProxyRoute:
    def __init__(
        self,
        api: AgentApi,
        tokens: TokenAccess,
        providers: ProviderGateway,
        settings: ApiSettings,
    ) -> None:
        self.api = api
        self.tokens = tokens
        self.providers = providers
        self.settings = settings
        self._timeout = httpx.Timeout(settings.proxy_timeout_seconds).as_dict()

    async def handle(self, request: Request) -> Response:
        key = await caller(request, self.api)
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        raw_path = raw.decode("latin-1").split("?", 1)[0]
        if not raw_path.startswith(PREFIX):
            raise FlowRefused("proxy_path_refused")
        provider_name, _, rest = raw_path[len(PREFIX) :].partition("/")
        self.api.check_provider(key, provider_name)
        provider, grant, url = await self._destination(request, provider_name, rest, self.api.tenants_seen(key))

        listed = _listed_in_connection(request) | {provider.quirks.api_auth.header.lower()}
        headers = [
            (name, value)
            for name, value in request.headers.items()
            if name not in NOT_FORWARDED and not name.startswith("connector-") and name not in listed
        ]
        if "user-agent" not in request.headers:
            headers.append(("user-agent", USER_AGENT))  # some APIs (GitHub's) refuse a request without one
        content = await self._body(request)
        # The agent's request as it is (no client defaults such as Accept-Encoding are added), on the provider's
        # long-lived pool; redirects are not followed: the agent gets the provider's own answer.
        upstream = httpx.Request(
            request.method, url, headers=headers, content=content, extensions={"timeout": self._timeout}
        )
        try:
            response = await self.providers.http.send_bare(
                provider.name, upstream, grant_auth(self.tokens, grant.id, provider)
            )
        except (NotAuthorized, ProviderError, httpx.HTTPError) as exc:
            raise _refusal(exc) from None
        dropped = NOT_RETURNED | _connection_tokens(response.headers)
        if response.is_stream_consumed:  # a 401 that could not be retried was read (and decoded) by GrantAuth
            dropped |= {"content-encoding", "content-length"}
        returned = [(name, value) for name, value in response.headers.multi_items() if name.lower() not in dropped]
        relayed: Response
        if self._small(response):
            relayed = Response(await self._read_small(response), status_code=response.status_code)
        else:
            relayed = StreamingResponse(
                self._relay(response), status_code=response.status_code, background=BackgroundTask(response.aclose)
            )
        relayed.raw_headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in returned]
        return relayed

    async def _destination(
        self, request: Request, provider_name: str, rest: str, tenants: frozenset[str]
    ) -> tuple[ResolvedProvider, GrantRecord, httpx.URL]:
        """The provider bound to the user's grant there (one the caller's `tenants` hold), the grant, and the URL
        the request goes to."""
        try:
            provider = await self.providers.resolve(provider_name)
        except ConnectorError as exc:
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        if not provider.entry.api_base_url:
            raise FlowRefused("proxy_not_available")
        query = request.scope.get("query_string", b"")
        if provider.api_base_url:  # a base without per-connection values: the path is checked before any read
            target_url(provider.api_base_url, rest, query)
        grant = await self.tokens.grant_for(_user(request), provider.name, (), tenants)
        if grant is None:
            raise FlowRefused("no_grant")
        try:
            provider = self.tokens.bound(grant, provider)  # the API base may be the grant's (an instance URL)
        except ConnectorError as exc:
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        if not provider.api_base_url:
            raise FlowRefused("proxy_not_available")
        return provider, grant, target_url(provider.api_base_url, rest, query)

    def _small(self, response: httpx.Response) -> bool:
        """Whether the response declares a body small enough to read whole (and within the size limit)."""
        if response.is_stream_consumed:
            return False
        declared = response.headers.get("content-length", "")
        limit = min(SMALL_RESPONSE_BYTES, self.settings.proxy_max_response_bytes)
        return declared.isdigit() and int(declared) <= limit

    async def _read_small(self, response: httpx.Response) -> bytes:
        """The provider's bytes as they came (still encoded), read before anything is sent to the agent: a failure
        or the time limit here is an error answer, not a cut-off body."""
        try:
            async with asyncio.timeout(self.settings.proxy_max_seconds):
                return b"".join([chunk async for chunk in response.aiter_raw()])
        except TimeoutError:
            log.warning("proxied response cut off at proxy_max_seconds")
            raise FlowRefused("upstream_timeout") from None
        except httpx.TimeoutException:
            raise FlowRefused("upstream_timeout") from None
        except httpx.HTTPError:
            raise FlowRefused("upstream_unavailable") from None
        finally:
            await response.aclose()

    async def _body(self, request: Request) -> bytes | AsyncIterator[bytes] | None:
        """Small bodies are read whole (so a 401 can be retried); larger ones stream, within the size limit."""
        declared = request.headers.get("content-length")
        chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
        if declared is None and not chunked:
            return None
        if declared is not None and declared.isdigit() and int(declared) <= self.settings.proxy_retry_body_bytes:
            return await read_body(request, self.settings.proxy_retry_body_bytes)
        if declared is not None and (not declared.isdigit() or int(declared) > self.settings.proxy_max_request_bytes):
            raise FlowRefused("body_too_large", detail={"limit": str(self.settings.proxy_max_request_bytes)})
        return self._limited(request)

    async def _limited(self, request: Request) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.settings.proxy_max_request_bytes:
                raise httpx.RequestError("request body over proxy_max_request_bytes")
            yield chunk

    async def _relay(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The provider's bytes as they come (still encoded), cut at the size and time limits."""
        if response.is_stream_consumed:
            yield response.content
            return
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.proxy_max_seconds
        async for chunk in response.aiter_raw():
            size += len(chunk)
            over = "proxy_max_response_bytes" if size > self.settings.proxy_max_response_bytes else None
            if over is None and loop.time() > deadline:
                over = "proxy_max_seconds"
            if over is not None:
                log.warning("proxied response cut off at %s", over)
                # Raising (not returning) makes the server abort the response, so the agent cannot take a
                # truncated body for a whole one.
                raise ProxyLimitExceeded(over)
            yield chunk


class ProxyLimitExceeded(Exception):
    """A proxied response passed a limit after its headers were sent."""


def _user(request: Request) -> Identity:
    return identity_of(
        request.headers.get(USER_ISSUER),
        request.headers.get(USER_SUBJECT),
        where="send the user as Connector-User-Issuer and Connector-User-Subject headers",
    )


def _listed_in_connection(request: Request) -> frozenset[str]:
    return _tokens(request.headers.get("connection", ""))


def _connection_tokens(headers: httpx.Headers) -> frozenset[str]:
    return _tokens(headers.get("connection", ""))


def _tokens(value: str) -> frozenset[str]:
    return frozenset(part.strip().lower() for part in value.split(",") if part.strip())


def _refusal(exc: NotAuthorized | ProviderError | httpx.HTTPError) -> FlowRefused:
    """What the agent is told when the token could not be had or the provider not reached."""
    if isinstance(exc, GrantNeedsUser):  # the reason, so the agent asks the user again and says why
        return FlowRefused("grant_needs_user", detail={"reason": exc.reason, "sentence": exc.sentence})
    if isinstance(exc, NotAuthorized):
        return FlowRefused("grant_unusable")
    if isinstance(exc, ProviderError):  # the refresh failed for now (ProviderUnavailable) or was refused: backing off
        retry = exc.retry_after if isinstance(exc, ProviderUnavailable) else None
        return FlowRefused("provider_unavailable", detail={"retry_after": str(max(1, math.ceil(retry or 1)))})
    if isinstance(exc, httpx.TimeoutException):
        return FlowRefused("upstream_timeout")
    return FlowRefused("upstream_unavailable")
