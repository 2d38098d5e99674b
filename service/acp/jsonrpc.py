"""JSON-RPC 2.0 as the connector checks it on an ACP connection: what a valid message looks like, and error replies.

Pure functions over decoded messages; no I/O and no SDK. `GuardedTransport` (`wire.py`) uses them to decide, before
the SDK sees a message, whether it is a request, a notification, a response, or something to refuse or drop. Problems
are described by shape only ("error is not an object"), never by the values, which may carry anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeGuard

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800
CANCEL_REQUEST: Final = "$/cancel_request"

# Deeper than any ACP message needs; bounded so nothing downstream (the SDK's deepcopy, pydantic) recurses far.
MAX_DEPTH: Final = 64

RequestId = str | int
IdKey = tuple[str, RequestId]


class Kind(StrEnum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"
    INVALID_REQUEST = "invalid_request"  # answer -32600 (with the id when it could be read, else null)
    IGNORED = "ignored"  # neither a request nor a response: logged and dropped, never answered


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: Kind
    problem: str | None = None  # what is wrong, by shape only
    reply_id: RequestId | None = None  # for INVALID_REQUEST: the id to answer, when it was valid


def valid_id(value: object) -> TypeGuard[RequestId]:
    """A request id this connector accepts: a string or an integer (JSON-RPC discourages fractions and null)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def id_key(value: RequestId) -> IdKey:
    # 1 and "1" are different requests.
    return (type(value).__name__, value)


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests objects/arrays deeper than `limit` (checked without recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def inspect(message: object) -> Verdict:
    """Classify one decoded message from the peer."""
    if not isinstance(message, dict):
        what = "a batch (array)" if isinstance(message, list) else f"a JSON {type(message).__name__}"
        return Verdict(Kind.INVALID_REQUEST, f"the message is {what}, not an object")
    has_id = "id" in message
    raw_id = message.get("id")
    readable_id = raw_id if has_id and valid_id(raw_id) else None
    if too_deep(message):
        if "method" in message:
            return Verdict(Kind.INVALID_REQUEST, f"nested deeper than {MAX_DEPTH} levels", readable_id)
        return Verdict(Kind.IGNORED, f"nested deeper than {MAX_DEPTH} levels")
    if "method" in message:
        problem = _request_problem(message)
        if problem is None and has_id and not valid_id(raw_id):
            problem = "the id is neither a string nor an integer"
        if problem is not None:
            return Verdict(Kind.INVALID_REQUEST, problem, readable_id)
        return Verdict(Kind.REQUEST if has_id else Kind.NOTIFICATION)
    if has_id or "result" in message or "error" in message:
        return Verdict(Kind.RESPONSE, response_problem(message))
    return Verdict(Kind.IGNORED, "neither a request nor a response")


def _request_problem(message: dict[str, Any]) -> str | None:
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc is not "2.0"'
    if not isinstance(message.get("method"), str):
        return "method is not a string"
    if "params" in message and not isinstance(message["params"], dict | list):
        return "params is neither an object nor an array"
    return None


def response_problem(message: dict[str, Any]) -> str | None:
    """What is wrong with a response's shape (its id aside), or None."""
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc is not "2.0"'
    if not valid_id(message.get("id")):
        return "the id is neither a string nor an integer"
    has_result, has_error = "result" in message, "error" in message
    if has_result == has_error:
        return "it has both result and error" if has_result else "it has neither result nor error"
    if has_error:
        error = message["error"]
        if not isinstance(error, dict):
            return "error is not an object"
        code = error.get("code")
        if not isinstance(code, int) or isinstance(code, bool):
            return "error.code is not an integer"
        if not isinstance(error.get("message"), str):
            return "error.message is not a string"
    return None


def error_reply(request_id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def method_label(message: dict[str, Any]) -> str:
    """The method for a log line: printable, at most 64 characters."""
    method = message.get("method")
    if not isinstance(method, str):
        return "?"
    shown = "".join(ch if ch.isprintable() else "?" for ch in method[:64])
    return shown + ("…" if len(method) > 64 else "")
