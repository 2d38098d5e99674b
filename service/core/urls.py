"""The one rule for URLs the connector is configured with or discovers: absolute, no credentials, https off loopback."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback_host(host: str | None) -> bool:
    """True for `localhost`, `*.localhost`, any 127.0.0.0/8 address and ::1 (brackets allowed)."""
    if not host:
        return False
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str, *, allow_query: bool = True) -> str | None:
    """Why `url` is not acceptable, or None: an absolute http(s) URL without user credentials or fragment,
    https unless its host is loopback, and without a query when `allow_query` is false. Never quotes the value."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an absolute http(s) URL, e.g. https://host.example.com"
    if parts.username is not None or parts.password is not None:
        return "must not contain user credentials"
    if parts.fragment or "#" in url:
        return "must not have a fragment"
    if not allow_query and (parts.query or "?" in url):
        return "must not have a query"
    if parts.scheme != "https" and not is_loopback_host(parts.hostname):
        return "must use https unless the host is loopback (127.0.0.1, ::1, localhost)"
    return None


def origin(url: str) -> str:
    """`scheme://host[:port]` of an absolute URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def host_of(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None
