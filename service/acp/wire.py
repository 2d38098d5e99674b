"""`GuardedTransport`: the connector's own stream between the SDK's `Connection` and the SDK transport it came with.

Every JSON-RPC message of an attached connection passes through it, in both directions, so this is where the
connector sees the wire and where it protects the SDK from a misbehaving peer:

- on byte streams (stdio) it reads the newline-delimited JSON itself: a line that is not JSON is answered -32700, and
  a line holding `null` is an invalid message like any other (the SDK's reader takes it for the end of the stream).
- incoming messages are checked (`jsonrpc.inspect`) before the SDK sees them. An invalid request is answered -32600
  here; something that is neither request nor response is dropped. A response is matched to a request of ours: a
  malformed one (e.g. `error` not an object) reaches the SDK as a well-formed error for that request, so the call
  that waits for it ends with an error instead of hanging; a response to an id we never sent means the peer lost
  track of our requests, so every request of ours still waiting on this connection ends that way too (and is
  withdrawn with `$/cancel_request`); a late answer to a request we gave up on is dropped. Log lines name the shape
  of the problem, never a value from the message.
- an incoming `$/cancel_request` is served here: the task serving that request of the peer's is cancelled and the
  request is answered -32800 (`serve`, which the adapter puts around the SDK's dispatch).
- on byte streams it also writes the lines itself (`NdjsonWriter`: the SDK's framing, written at once instead of
  through the SDK's send queue and its writer task, a task switch and a future per message).
- the end of the stream (EOF, a failed read or write, `close()`) is noticed once: the listener hears it, `closed`
  turns true, `wait_closed()` returns, and later sends fail at once with `ConnectionError` (the SDK's stdio writer
  would otherwise wait forever on a dead pipe).

The SDK's `Transport` is a structural protocol (`send`, `receive`, `close`); nothing here touches SDK internals.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from acp.exceptions import RequestError

from . import jsonrpc
from .jsonrpc import CANCEL_REQUEST, IdKey, Kind, RequestId, id_key

log = logging.getLogger("service.acp.wire")

T = TypeVar("T")

MALFORMED = "malformed_response"  # `error.data.connector` of the errors this module puts in place of a bad response
_END = object()  # the end of the stream (distinct from a `null` the peer sent)


class _Unreadable(Exception):
    """A line that is not JSON (the message says why, never what)."""


class Transport(Protocol):
    """The SDK's message transport, structurally (`acp`'s own protocol lives in a private module)."""

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


MAX_LINE_BYTES = 50 * 1024 * 1024  # the SDK's own stdio buffer limit; a longer line is refused, not buffered


class NdjsonLines:
    """Lines of newline-delimited JSON from a byte stream (the SDK's stdio framing, read here instead)."""

    def __init__(self, reader: asyncio.StreamReader, timeout: float | None = None) -> None:
        self._reader = reader
        self._timeout = timeout

    async def next(self) -> bytes | None:
        """The next line (without its newline), or None at the end of the stream. Raises `LineTooLong`."""
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(self._reader.readuntil(b"\n"), self._timeout)
                except asyncio.LimitOverrunError as exc:
                    chunk = await asyncio.wait_for(self._reader.readexactly(exc.consumed), self._timeout)
                    size += len(chunk)
                    if size <= MAX_LINE_BYTES:
                        chunks.append(chunk)
                    continue
                size += len(chunk)
                if size > MAX_LINE_BYTES:
                    raise LineTooLong(size)
                chunks.append(chunk)
                return b"".join(chunks)
        except asyncio.IncompleteReadError as exc:
            if not chunks and not exc.partial:
                return None
            return b"".join(chunks) + exc.partial


class NdjsonWriter:
    """Messages as newline-delimited JSON on a byte stream, framed as the SDK frames them. Each message is written in
    one `write` call, so concurrent senders never interleave, and in the order `send` is called."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, message: dict[str, Any]) -> None:
        self._writer.write((json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8"))
        await self._writer.drain()


class LineTooLong(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"a line of {size} bytes (at most {MAX_LINE_BYTES})")


class WireListener(Protocol):
    """What the connector's per-connection state (`AcpLink`) hears from the wire."""

    def on_incoming(self, message: dict[str, Any]) -> None:
        """A valid message from the peer, before the SDK handles it."""

    def on_outgoing(self, message: dict[str, Any]) -> None:
        """A message of ours, just before it is written."""

    def on_closed(self) -> None:
        """The connection ended (once)."""


@dataclass(eq=False)
class ServedRequest:
    """One request of the peer's that this side is serving."""

    key: IdKey
    method: str
    params: Any = field(repr=False)
    task: asyncio.Task[Any] | None = None
    cancelled_by_peer: bool = False


# The request of the peer's that the current task serves. `receive()` sets it just before it hands a request to the
# SDK, whose receive loop then creates the task that serves it: a new task copies the context, so that task (and any
# task it starts) sees its own request here.
SERVING: contextvars.ContextVar[ServedRequest | None] = contextvars.ContextVar("acp_serving", default=None)


def serving() -> ServedRequest | None:
    """The peer's request the current task is serving, if any."""
    return SERVING.get()


class GuardedTransport:
    def __init__(
        self,
        inner: Transport,
        listener: WireListener,
        lines: NdjsonLines | None = None,
        writer: NdjsonWriter | None = None,
    ) -> None:
        self._inner = inner
        self._lines = lines  # on byte streams: read here
        self._writer = writer  # on byte streams: written here; `inner` is then only closed
        self.listener = listener
        self._ended = False
        self._closed_event = asyncio.Event()
        self._outstanding: dict[IdKey, str] = {}  # our requests without an answer: id -> method
        self._abandoned: set[IdKey] = set()  # ours we stopped waiting for; their late answers are dropped
        self._highest_sent = -1  # our ids are the SDK's integers from 0: anything above was never sent
        self._serving: dict[IdKey, ServedRequest] = {}
        self._ready: deque[dict[str, Any]] = deque()  # replies made up here, handed to the SDK before reading on

    # -- state ---------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._ended

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    def abandon(self, request_id: RequestId) -> None:
        """We stopped waiting for our request `request_id` (and told the peer): its answer, if any, is dropped."""
        key = id_key(request_id)
        if self._outstanding.pop(key, None) is not None:
            self._abandoned.add(key)

    # -- Transport -----------------------------------------------------------------------------------------
    async def send(self, message: dict[str, Any]) -> None:
        if self._ended:
            raise ConnectionError("Connection closed")
        request_id = message.get("id")
        is_request = "method" in message and jsonrpc.valid_id(request_id)
        if is_request:
            assert request_id is not None
            self._outstanding[id_key(request_id)] = str(message["method"])
            if isinstance(request_id, int) and request_id > self._highest_sent:
                self._highest_sent = request_id
        elif "method" not in message and jsonrpc.valid_id(request_id):
            assert request_id is not None
            self._serving.pop(id_key(request_id), None)  # our answer to one of the peer's requests
        self.listener.on_outgoing(message)
        try:
            await (self._inner if self._writer is None else self._writer).send(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_request:
                assert request_id is not None
                self._outstanding.pop(id_key(request_id), None)
            self.end(f"write failed ({type(exc).__name__})")
            raise ConnectionError("Connection closed") from None

    async def receive(self) -> dict[str, Any] | None:
        while True:
            if self._ready:
                SERVING.set(None)
                return self._ready.popleft()
            if self._ended:
                return None
            try:
                message = await self._read()
            except asyncio.CancelledError:
                raise
            except _Unreadable as exc:
                log.warning("refused a line from the client that is not JSON: %s", exc)
                await self._reply(jsonrpc.error_reply(None, jsonrpc.PARSE_ERROR, "Parse error"))
                continue
            except Exception as exc:
                self.end(f"read failed ({type(exc).__name__})")
                return None
            if message is _END:
                self.end("end of stream")
                return None
            SERVING.set(None)
            handed = await self._take(message)
            if handed is not None:
                return handed

    async def close(self) -> None:
        self.end("closed")
        await self._inner.close()

    async def _read(self) -> Any:
        """The next decoded message (any JSON value, `null` included), or `_END`."""
        if self._lines is None:
            message = await self._inner.receive()
            return _END if message is None else message
        while True:
            try:
                line = await self._lines.next()
            except LineTooLong as exc:
                raise _Unreadable(str(exc)) from None
            if line is None:
                return _END
            if not line.strip():
                continue
            try:
                return json.loads(line)
            except (ValueError, RecursionError) as exc:  # bad JSON, bad UTF-8, nested beyond the parser
                raise _Unreadable(f"{type(exc).__name__}, {len(line)} bytes") from None

    # -- serving the peer's requests -----------------------------------------------------------------------
    async def serve(self, request: ServedRequest, handling: Awaitable[T]) -> T:
        """Run the SDK's handling of the peer's `request` so that `$/cancel_request` can cancel it.

        A request the peer cancelled is answered -32800 (the SDK turns `RequestError` into the error reply).
        """
        task = asyncio.current_task()
        request.task = task
        try:
            if request.cancelled_by_peer:  # the cancellation came before the handler started
                raise asyncio.CancelledError
            return await handling
        except asyncio.CancelledError:
            if not request.cancelled_by_peer:
                raise
            if task is not None:
                task.uncancel()
            raise RequestError(jsonrpc.REQUEST_CANCELLED, "Request cancelled") from None
        finally:
            close = getattr(handling, "close", None)  # a coroutine never awaited (cancelled first) is closed quietly
            if callable(close):
                close()

    # -- internals -----------------------------------------------------------------------------------------
    async def _take(self, message: Any) -> dict[str, Any] | None:
        """The message to hand to the SDK, or None when it was dealt with here."""
        verdict = jsonrpc.inspect(message)
        if verdict.kind is Kind.INVALID_REQUEST:
            method = jsonrpc.method_label(message) if isinstance(message, dict) else "?"
            log.warning("refused an invalid request from the client (method %s): %s", method, verdict.problem)
            await self._reply(jsonrpc.error_reply(verdict.reply_id, jsonrpc.INVALID_REQUEST, "Invalid Request"))
            return None
        if verdict.kind is Kind.IGNORED:
            log.warning("dropped a message from the client: %s", verdict.problem)
            return None
        if verdict.kind is Kind.RESPONSE:
            return await self._take_response(message, verdict.problem)
        if message["method"] == CANCEL_REQUEST:
            if verdict.kind is Kind.NOTIFICATION:
                self._peer_cancels(message.get("params"))
                return None
        elif message["method"].startswith("$/") and verdict.kind is Kind.NOTIFICATION:
            log.debug("ignored protocol notification %s", jsonrpc.method_label(message))
            return None
        if verdict.kind is Kind.REQUEST:
            request = ServedRequest(id_key(message["id"]), message["method"], message.get("params"))
            self._serving[request.key] = request
            SERVING.set(request)
        self.listener.on_incoming(message)
        return cast(dict[str, Any], message)

    async def _take_response(self, message: dict[str, Any], problem: str | None) -> dict[str, Any] | None:
        request_id = message.get("id")
        key = id_key(request_id) if jsonrpc.valid_id(request_id) else None
        if key is not None and key in self._outstanding:
            self._outstanding.pop(key)
            if problem is None:
                self.listener.on_incoming(message)
                return message
            log.warning("the client's response to our request is malformed: %s", problem)
            assert request_id is not None
            reply = self._malformed(request_id, problem)
            self.listener.on_incoming(reply)
            return reply
        if key is not None and (key in self._abandoned or self._sent_before(request_id)):
            self._abandoned.discard(key)
            log.debug("dropped a late or repeated response from the client")
            return None
        # Not an id we sent: the peer lost track of our requests, and nothing says which one it meant.
        what = problem or "it answers an id that was never sent"
        waiting = list(self._outstanding)
        log.warning(
            "dropped a response from the client that matches no request of ours (%s); %d request(s) of ours end",
            what,
            len(waiting),
        )
        for pending in waiting:
            del self._outstanding[pending]
            reply = self._malformed(pending[1], f"the client answered an unknown request id instead ({what})")
            self.listener.on_incoming(reply)
            self._ready.append(reply)
            await self._notify(CANCEL_REQUEST, {"requestId": pending[1]})
        return None

    def _sent_before(self, request_id: Any) -> bool:
        return jsonrpc.valid_id(request_id) and isinstance(request_id, int) and 0 <= request_id <= self._highest_sent

    @staticmethod
    def _malformed(request_id: RequestId, problem: str) -> dict[str, Any]:
        return jsonrpc.error_reply(
            request_id,
            jsonrpc.INTERNAL_ERROR,
            "Malformed response from the client",
            {"connector": MALFORMED, "problem": problem},
        )

    def _peer_cancels(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, dict) else None
        request = self._serving.get(id_key(request_id)) if jsonrpc.valid_id(request_id) else None
        if request is None or request.cancelled_by_peer:
            return  # not in progress (already answered, or never sent): nothing to do
        request.cancelled_by_peer = True
        if request.task is not None and not request.task.done():
            request.task.cancel()

    async def _reply(self, message: dict[str, Any]) -> None:
        try:
            await self.send(message)
        except ConnectionError:
            pass

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        await self._reply({"jsonrpc": "2.0", "method": method, "params": params})

    def end(self, why: str) -> None:
        """The connection ended (`why` is for the debug log); idempotent."""
        if self._ended:
            return
        self._ended = True
        log.debug("ACP connection ended: %s", why)
        self._outstanding.clear()
        self._abandoned.clear()
        self._serving.clear()
        self._closed_event.set()
        try:
            self.listener.on_closed()
        except Exception:
            log.exception("connection-closed listener failed")
