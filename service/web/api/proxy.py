"""`/v1/proxy/{provider}/{path}`: the agent calls a provider's API with the user's token injected here.

The token is added by `GrantAuth` (refreshed ahead of expiry; one refresh and one retry after a 401 when the
request body can be sent again). Bodies stream both ways (an answer that declares at most SMALL_RESPONSE_BYTES is
read whole, then sent); the agent's own `Authorization`, cookies, our
`Connector-*` headers, hop-by-hop headers and what proxies say of the agent (`Forwarded`, `X-Forwarded-*`,
`X-Real-IP`, `Via`, ...) never reach the provider; the target is always under the provider's
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
    AccountChoiceNeeded,
    ConnectorError,
    FlowRefused,
    GrantNeedsUser,
    NotAuthorized,
    ProviderError,
    ProviderUnavailable,
    VaultError,
    account_choice_refused,
)
from service.core.identity import Identity
from service.core.records import GrantRecord
from service.oauth import AnswerTooLarge, ProviderGateway, ResolvedProvider
from service.tokens import TokenAccess, api_origin, grant_auth, unreadable_error
from service.version import __version__

from ..inputs import read_body
from .io import caller, identity_of

log = logging.getLogger("service.web")

PREFIX = "/v1/proxy/"
USER_ISSUER = "connector-user-issuer"
USER_SUBJECT = "connector-user-subject"
ACCOUNT = "connector-account"  # which of the user's accounts at the provider (service.core.accounts)
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
# What a proxy on the agent's side says of it (its address, host names, scheme, the hops): the agent's topology is
# not the provider's business, and a provider's own host or scheme logic could follow it.
PROXY_IDENTITY = frozenset(
    {
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-forwarded-server",
        "x-forwarded-ssl",
        "x-forwarded-scheme",
        "x-real-ip",
        "x-client-ip",
        "x-cluster-client-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "fastly-client-ip",
        "x-original-forwarded-for",
        "x-original-host",
        "x-original-url",
        "x-rewrite-url",
        "via",
    }
)
NOT_FORWARDED = HOP_BY_HOP | PROXY_IDENTITY | {"authorization", "cookie", "content-length", "expect"}
# The server writes its own Date on every response; a second one would make the field invalid (RFC 9110 5.3, 6.6.1).
NOT_RETURNED = HOP_BY_HOP | {"set-cookie", "www-authenticate", "date"}
NOT_FORWARDED_RAW = frozenset(name.encode("latin-1") for name in NOT_FORWARDED)
NOT_RETURNED_RAW = frozenset(name.encode("latin-1") for name in NOT_RETURNED)
USER_AGENT_RAW = USER_AGENT.encode("latin-1")
_UNSAFE_PATH = re.compile(r"(^|/)\.\.?(/|$)|\\|[\x00-\x1f\x7f]")
# A response that declares at most this many bytes is read whole and sent as one body: streaming it would cost a
# task (and a task group) per response, more than the whole of a small API answer.
SMALL_RESPONSE_BYTES = 64 * 1024
# A 401's body is read whole (before a refresh, to be relayed when there is no retry): an error's few words, not a
# download; a larger one is answered 502 upstream_unavailable.
MAX_401_BYTES = 64 * 1024


@functools.lru_cache(maxsize=64)
def _api_base(base: str) -> tuple[httpx.URL, str]:
    """The provider's API base parsed once, and its path as a prefix ending in "/"."""
    origin = api_origin(base)
    return origin, origin.raw_path.decode("ascii").rstrip("/") + "/"


def target_url(base: str, raw_path: str, query: bytes) -> httpx.URL:
    """`raw_path` (as sent, percent-encoded) under `base`; FlowRefused `proxy_path_refused` if it could leave it.

    Built and checked once per distinct (base, path, query) among the last TARGETS_KEPT: parsing a URL costs more
    than the rest of the route's own work, and an agent calls the same few endpoints again and again. A refusal
    is an exception, so it is never kept."""
    if len(raw_path) + len(query) > TARGET_KEPT_MAX_CHARS:
        return _target_url.__wrapped__(base, raw_path, query)
    return _target_url(base, raw_path, query)


TARGETS_KEPT = 1024
TARGET_KEPT_MAX_CHARS = 512  # at most ~1 MB kept


@functools.lru_cache(maxsize=TARGETS_KEPT)
def _target_url(base: str, raw_path: str, query: bytes) -> httpx.URL:
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
        deadline = asyncio.get_running_loop().time() + self.settings.proxy_max_seconds  # the whole exchange's
        key = await caller(request, self.api)
        raw = request.scope.get("raw_path") or request.scope["path"].encode()
        raw_path = raw.decode("latin-1").split("?", 1)[0]
        if not raw_path.startswith(PREFIX):
            raise FlowRefused("proxy_path_refused")
        provider_name, _, rest = raw_path[len(PREFIX) :].partition("/")
        self.api.check_provider(key, provider_name)
        provider, grant, url = await self._destination(request, provider_name, rest, self.api.tenants_seen(key))

        headers = _forwarded(request.scope["headers"], provider.quirks.api_auth.header)
        content = await self._body(request)
        # The agent's request as it is (no client defaults such as Accept-Encoding are added), on the provider's
        # long-lived pool; redirects are not followed: the agent gets the provider's own answer.
        upstream = httpx.Request(
            request.method, url, headers=headers, content=content, extensions={"timeout": self._timeout}
        )
        max_401_bytes = min(MAX_401_BYTES, self.settings.proxy_max_response_bytes)
        try:
            response = await self.providers.http.send_bare(
                provider.name,
                upstream,
                grant_auth(self.tokens, grant.id, provider),
                deadline=deadline,
                max_401_bytes=max_401_bytes,
            )
        except TimeoutError:
            log.warning("proxied request cut off at proxy_max_seconds")
            raise FlowRefused("upstream_timeout") from None
        except AnswerTooLarge:
            log.warning("proxied 401 answer cut off: its body is over %s bytes", max_401_bytes)
            raise FlowRefused("upstream_unavailable") from None
        except VaultError:
            raise self._unreadable(grant) from None
        except (NotAuthorized, ProviderError, httpx.HTTPError) as exc:
            raise _refusal(exc) from None
        raw_headers = response.headers.raw
        dropped = NOT_RETURNED_RAW | _tokens(b", ".join(v for n, v in raw_headers if n.lower() == b"connection"))
        if response.is_stream_consumed:  # a 401 that could not be retried was read (and decoded) by GrantAuth
            dropped |= {b"content-encoding", b"content-length"}
        relayed: Response
        if self._small(response):
            relayed = Response(await self._read_small(response, deadline), status_code=response.status_code)
        else:
            relayed = StreamingResponse(
                self._relay(response, deadline),
                status_code=response.status_code,
                background=BackgroundTask(response.aclose),
            )
        # As the provider sent them (bytes: nothing decoded and encoded again), less what only this hop may see.
        relayed.raw_headers = [(n.lower(), v) for n, v in raw_headers if n.lower() not in dropped]
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
        base = provider.api_base_url
        # A base without per-connection values: the path is checked before any read.
        checked = target_url(base, rest, query) if base else None
        account = request.headers.get(ACCOUNT)
        try:
            grant = await self.tokens.grant_for(
                _user(request), provider.name, (), tenants, account=account, display_name=provider.display_name
            )
        except AccountChoiceNeeded as exc:
            raise account_choice_refused(exc) from None
        if grant is None:
            raise FlowRefused("no_grant" if account is None else "unknown_account")
        try:
            provider = self.tokens.bound(grant, provider)  # the API base may be the grant's (an instance URL)
        except VaultError:
            raise self._unreadable(grant) from None
        except ConnectorError as exc:
            raise FlowRefused(exc.code, detail={"message": str(exc)}) from None
        if not provider.api_base_url:
            raise FlowRefused("proxy_not_available")
        if checked is not None and provider.api_base_url == base:
            return provider, grant, checked
        return provider, grant, target_url(provider.api_base_url, rest, query)

    def _unreadable(self, grant: GrantRecord) -> FlowRefused:
        """A grant the vault cannot decrypt: the operator's to fix (told in the log), 503 `grant_unreadable` here."""
        return FlowRefused(unreadable_error(grant, self.tokens.vault).code)

    def _small(self, response: httpx.Response) -> bool:
        """Whether the response declares a body small enough to read whole (and within the size limit)."""
        if response.is_stream_consumed:
            return False
        declared = response.headers.get("content-length", "")
        limit = min(SMALL_RESPONSE_BYTES, self.settings.proxy_max_response_bytes)
        return declared.isdigit() and int(declared) <= limit

    async def _read_small(self, response: httpx.Response, deadline: float) -> bytes:
        """The provider's bytes as they came (still encoded), read before anything is sent to the agent: a failure
        or the time limit here is an error answer, not a cut-off body."""
        try:
            async with asyncio.timeout_at(deadline):
                # The transport's stream itself (its errors are httpx's): no decoder or chunker in between.
                stream = response.stream
                assert isinstance(stream, httpx.AsyncByteStream)
                response.is_stream_consumed = True
                return b"".join([chunk async for chunk in stream])
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

    async def _relay(self, response: httpx.Response, deadline: float) -> AsyncIterator[bytes]:
        """The provider's bytes as they come (still encoded), cut at the size limit and at `deadline`."""
        if response.is_stream_consumed:
            yield response.content
            return
        size = 0
        loop = asyncio.get_running_loop()
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


def _forwarded(received: list[tuple[bytes, bytes]], auth_header: str) -> list[tuple[bytes, bytes]]:
    """The agent's headers (the ASGI scope's: names in lower case) that go on to the provider: neither hop-by-hop
    ones (those its Connection headers list included), nor its Authorization or cookies, nor what proxies say of it
    (`PROXY_IDENTITY`), nor our `Connector-*` headers, nor the API's own auth header; a User-Agent of ours when it
    sent none."""
    listed = _tokens(b", ".join(value for name, value in received if name == b"connection"))
    listed |= {auth_header.lower().encode("latin-1")}
    headers = [
        (name, value)
        for name, value in received
        if name not in NOT_FORWARDED_RAW and not name.startswith(b"connector-") and name not in listed
    ]
    if not any(name == b"user-agent" for name, _ in received):
        headers.append((b"user-agent", USER_AGENT_RAW))  # some APIs (GitHub's) refuse a request without one
    return headers


def _tokens(value: bytes) -> frozenset[bytes]:
    """The tokens of a Connection header's value, in lower case."""
    return frozenset(token for part in value.split(b",") if (token := part.strip().lower()))


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
