"""The input layer: every path, query parameter, path parameter, form field and body is checked here first.

Checked for length, character set and NUL before any handler, and so before the store, sees it: a value that
fails is refused with `FlowRefused("invalid_input")` (400), a body over its limit with `body_too_large` (413)
while it streams in, a body of the wrong type with `unsupported_media_type` (415). Nothing is spooled to disk.

- `InputGuard` checks the path, the query string and the body size of every request (for `service.web.front`).
- `checked(endpoint)` checks a route's path parameters by name (`PATH_PARAMETERS`).
- `read_form` and `read_json_object` read a small body, streaming, and check what is in it.

A rule names what a value may hold; sentences name the field, never echo the value.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from ..core.errors import FlowRefused
from ..util.text import printable

log = logging.getLogger("service.web")

INVALID_INPUT = "invalid_input"
BODY_TOO_LARGE = "body_too_large"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"

MAX_PATH = 1024  # characters of the decoded path
MAX_SEGMENT = 256  # characters of one path segment
MAX_QUERY = 8192  # bytes of the raw query string
MAX_FIELDS = 32  # query parameters, or form fields
DEFAULT_MAX_BODY = 64 * 1024  # any body, unless a route reads less (`read_form`, `read_json_object`)
MAX_FORM_BODY = 4096  # the consent form: a CSRF token and a button
MAX_JSON_BODY = 8192
MAX_JSON_DEPTH = 16

_FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class Rule:
    """What a value may be: at most `max_length` characters, printable (no control character, no NUL), and, when
    `pattern` is set, matching it whole. `shape` says in words what the pattern allows."""

    max_length: int
    pattern: re.Pattern[str] | None = None
    shape: str = "printable text"

    def problem(self, value: str) -> str | None:
        if not value and self.pattern is not None:
            return "is empty"
        if len(value) > self.max_length:
            return f"is longer than {self.max_length} characters"
        if self.pattern is not None:
            return None if self.pattern.fullmatch(value) else f"must be {self.shape}"
        return None if printable(value) else "contains a control character"


TEXT = Rule(4096)
# Ids we issue (elicitations, verifications), provider names, and other names that go to the store as they are.
NAME = Rule(64, re.compile(r"[A-Za-z0-9_-]+"), "letters, digits, '-' or '_'")
# Handles we issue and get back (OAuth state, confirm flow ids and codes): URL-safe, unreserved characters.
HANDLE = Rule(512, re.compile(r"[A-Za-z0-9._~-]+"), "letters, digits, '.', '_', '~' or '-'")
# What a provider sends back (RFC 6749 VSCHAR: printable ASCII): codes, error codes, issuers.
ASCII = Rule(4096, re.compile(r"[\x20-\x7e]+"), "printable ASCII")
CHOICE = Rule(32, re.compile(r"[a-z_]+"), "a lower-case word")
CSRF = Rule(256, re.compile(r"[A-Za-z0-9_.-]+"), "a form token")

PATH_PARAMETERS: dict[str, Rule] = {"elicitation_id": NAME, "provider": NAME, "grant_id": NAME}
QUERY_PARAMETERS: dict[str, Rule] = {
    "elicitationId": NAME,
    "state": HANDLE,
    "flow_id": HANDLE,
    "code": ASCII,
    "error": Rule(256, ASCII.pattern, ASCII.shape),
    "iss": Rule(2048, ASCII.pattern, ASCII.shape),
    "ticket": HANDLE,
}
FORM_FIELDS: dict[str, Rule] = {"csrf": CSRF, "action": CHOICE}
# The credential form: its binding and ticket, and the values typed (any other name: TEXT, at most 4096 characters).
CREDENTIAL_FORM_FIELDS: dict[str, Rule] = {"csrf": CSRF, "ticket": HANDLE}
MAX_CREDENTIAL_FORM_BODY = 16 * 1024


def invalid(problem: str) -> FlowRefused:
    return FlowRefused(INVALID_INPUT, detail={"problem": problem})


def check_fields(fields: Sequence[tuple[str, str]], rules: Mapping[str, Rule], what: str) -> dict[str, str]:
    """The fields as a dict, when each passes its rule (TEXT for names without one) and none repeats."""
    if len(fields) > MAX_FIELDS:
        raise invalid(f"it has more than {MAX_FIELDS} {what}s")
    checked: dict[str, str] = {}
    for name, value in fields:
        known = name in rules
        label = f"the {what} '{name}'" if known else f"a {what}"
        if not known and (len(name) > 64 or not printable(name)):
            raise invalid(f"a {what} name is too long or contains a control character")
        if name in checked:
            raise invalid(f"{label} is given twice")
        problem = rules.get(name, TEXT).problem(value)
        if problem is not None:
            raise invalid(f"{label} {problem}")
        checked[name] = value
    return checked


def check_path(raw_path: bytes) -> None:
    """The path, percent-decoded, is UTF-8, printable and of bounded length (overall and per segment)."""
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("the address is not UTF-8") from None
    if len(path) > MAX_PATH:
        raise invalid(f"the address is longer than {MAX_PATH} characters")
    if not printable(path):
        raise invalid("the address contains a control character")
    if any(len(segment) > MAX_SEGMENT for segment in path.split("/")):
        raise invalid(f"a part of the address is longer than {MAX_SEGMENT} characters")


def check_query(query_string: bytes) -> dict[str, str]:
    """The query parameters, each checked against its rule by name."""
    if len(query_string) > MAX_QUERY:
        raise invalid(f"the query is longer than {MAX_QUERY} bytes")
    try:
        fields = parse_qsl(
            query_string.decode("ascii"), keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        raise invalid(f"the query is not UTF-8 or has more than {MAX_FIELDS} parameters") from None
    return check_fields(fields, QUERY_PARAMETERS, "query parameter")


def check_path_params(params: Mapping[str, Any]) -> None:
    for name, value in params.items():
        rule = PATH_PARAMETERS.get(name, TEXT)
        problem = rule.problem(str(value))
        if problem is not None:
            raise invalid(f"the {name.replace('_', ' ')} in the address {problem}")


Endpoint = Callable[[Request], Awaitable[Response]]


def checked(endpoint: Endpoint) -> Endpoint:
    """`endpoint` behind the path-parameter rules: a malformed id is refused before the handler runs."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        check_path_params(request.path_params)
        return await endpoint(request)

    return guarded


# -- bodies ------------------------------------------------------------------------------------------------------


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():
        raise invalid("the Content-Length header is not a number")
    return int(declared)


def too_large(limit: int) -> FlowRefused:
    return FlowRefused(BODY_TOO_LARGE, detail={"limit": str(limit)})


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes, refused as soon as the declared or streamed size is over."""
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


async def read_form(
    request: Request, rules: Mapping[str, Rule] = FORM_FIELDS, limit: int = MAX_FORM_BODY
) -> dict[str, str]:
    """A small url-encoded form, each field checked by name. Multipart is refused before any of it is read."""
    if _media_type(request) != _FORM_TYPE:
        raise FlowRefused(UNSUPPORTED_MEDIA_TYPE, detail={"expected": _FORM_TYPE})
    raw = await read_body(request, limit)
    try:
        fields = parse_qsl(raw.decode("ascii"), keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise invalid(f"the form is not UTF-8 or has more than {MAX_FIELDS} fields") from None
    return check_fields(fields, rules, "form field")


async def read_json_object(request: Request, limit: int = MAX_JSON_BODY, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object of at most `limit` bytes, every string in it printable text (`empty_ok`: no body
    at all reads as `{}`).

    FlowRefused `body_too_large` over the limit, `bad_request` when it is not a JSON object, `invalid_input`
    when a string in it carries a control character or the nesting is deeper than MAX_JSON_DEPTH.
    """
    raw = await read_body(request, limit)
    if empty_ok and not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise FlowRefused("bad_request", detail={"problem": "the body is not JSON"}) from None
    if not isinstance(body, dict):
        raise FlowRefused("bad_request", detail={"problem": "the body must be a JSON object"})
    _check_json(body, 0)
    return body


def _check_json(value: Any, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise invalid(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        if not printable(value):
            raise invalid("a string in the JSON body contains a control character")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, depth + 1)
            _check_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json(item, depth + 1)


# -- the request line and the declared body, for every request ------------------------------------------------


class BodyOverLimit(Exception):
    """Raised inside `receive` when a streamed body passes its limit; `Front` answers 413."""


class InputGuard:
    """Refuses a malformed path or query, and any body over its limit, before the app runs (`Front` asks it for
    every request and counts a streamed body against `limit_for(path)`).

    `max_body` bounds every body, streamed or declared; `body_limits` gives larger or smaller bounds to paths
    under a prefix (the longest prefix wins). A handler that reads a body reads it with a tighter limit of its own.
    """

    def __init__(self, *, max_body: int = DEFAULT_MAX_BODY, body_limits: Mapping[str, int] | None = None) -> None:
        self.max_body = max_body
        self.body_limits = sorted((body_limits or {}).items(), key=lambda item: -len(item[0]))

    def limit_for(self, path: str) -> int:
        for prefix, limit in self.body_limits:
            if path.startswith(prefix):
                return limit
        return self.max_body

    def check(self, scope: Scope, limit: int, content_length: bytes | None) -> None:
        """FlowRefused when the path, the query or the declared body size (`content_length`, the header's value)
        is refused."""
        check_path(scope.get("raw_path") or scope["path"].encode())
        check_query(scope.get("query_string", b""))
        if content_length is not None:
            declared = content_length.decode("latin-1")
            if not declared.isdigit():
                raise invalid("the Content-Length header is not a number")
            if int(declared) > limit:
                raise too_large(limit)
