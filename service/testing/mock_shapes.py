"""What an emulated provider needs from its catalog entry: its URLs moved onto the mock, its routes as patterns,
and token answers and errors shaped as the entry says the real provider shapes them."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from service.providers import ProviderEntry
from service.providers.quirks import PLACEHOLDER


def mock_url(base: str, template: str) -> str:
    """A real provider's URL on the mock: `https://host/path` becomes `{base}/host/path` (placeholders kept, so
    `https://{subdomain}.myshopify.com/admin` is `{base}/{subdomain}.myshopify.com/admin`). A URL that is a
    per-connection value (`{instance_url}/...`) is left as it is: the mock hands out that value itself."""
    if template.startswith("{") or template.startswith(base):
        return template
    parts = urlsplit(template)
    query = f"?{parts.query}" if parts.query else ""
    return f"{base}/{parts.netloc}{parts.path}{query}"


def path_pattern(relative: str, *, prefix: bool = False) -> re.Pattern[str]:
    """A route's path template (`/{tenant}/oauth2/token`) as a pattern capturing each placeholder by name."""
    pattern, last = "", 0
    for match in PLACEHOLDER.finditer(relative):
        pattern += re.escape(relative[last : match.start()]) + f"(?P<{match.group(1)}>[^/]+?)"
        last = match.end()
    pattern += re.escape(relative[last:].rstrip("/" if prefix else ""))
    return re.compile(pattern + ("(?:/.*)?" if prefix else ""))


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint of an emulated provider: its kind (authorize, token, ...), method (None: any), path pattern."""

    kind: str
    method: str | None
    pattern: re.Pattern[str]


def put(document: dict[str, Any], pointer: str, value: Any) -> None:
    """Set `value` at a JSON pointer in `document`, making the objects on the way."""
    parts = [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]
    for part in parts[:-1]:
        document = document.setdefault(part, {})
    document[parts[-1]] = value


def shaped_token_answer(
    entry: ProviderEntry, body: Mapping[str, Any], *, values: Mapping[str, str], account_id: str
) -> dict[str, Any]:
    """A standard token answer (`body`) laid out as `entry` says its provider lays it out."""
    quirks, shape = entry.quirks, entry.quirks.token_response
    answer: dict[str, Any] = {}
    if shape.ok_flag is not None:
        put(answer, shape.ok_flag, True)
    put(answer, shape.access_token, body["access_token"])
    put(answer, shape.token_type, body.get("token_type", "bearer"))
    if "scope" in body:
        asked = body["scope"].replace(",", " ").split()
        put(answer, shape.scope, entry.scope_separator.join(entry.scope_aliases.get(s, s) for s in asked))
    for member in ("refresh_token", "id_token"):
        if member in body:
            put(answer, getattr(shape, member), body[member])
    if "expires_in" in body and shape.expires_form != "never":
        seconds = int(body["expires_in"])
        given = {"milliseconds": seconds * 1000, "epoch_seconds": int(time.time()) + seconds}
        put(answer, shape.expires, given.get(shape.expires_form, seconds))
    if "refresh_token_expires_in" in body:  # a migrated legacy grant's (Shopify's answer has it)
        answer["refresh_token_expires_in"] = body["refresh_token_expires_in"]
    for value in quirks.values_from("token_response"):
        assert value.pointer is not None
        put(answer, value.pointer, values[value.name])
    if quirks.account_id_source == "token_response":
        put(answer, entry.account_id_field, account_id)
    return answer


def shaped_error(entry: ProviderEntry, error: str, status: int) -> tuple[int, dict[str, Any]]:
    """An OAuth error answer as `entry`'s provider sends it: at its error member, with 200 when it says so."""
    shape = entry.quirks.token_response
    answer: dict[str, Any] = {}
    if shape.ok_flag is not None:
        put(answer, shape.ok_flag, False)
    put(answer, shape.error, error)
    return (200 if error in shape.errors_with_200 else status), answer


def account_document(entry: ProviderEntry, account: Mapping[str, Any], account_id: str) -> dict[str, Any]:
    """The userinfo answer: the account, with its id where `account_id_field` says (a name or a JSON pointer)."""
    document = dict(account)
    field = entry.account_id_field
    if field.startswith("/"):
        put(document, field, account_id)
    else:
        document[field] = account_id
    return document
