"""The one rule for URLs: those the connector is configured with or discovers, and webhook endpoints' addresses.

One test says what is loopback (`is_loopback_host`) and one what is public (`is_public_address`); every check of a
URL here is built on them.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_WEBHOOK_URL_LENGTH = 2048
_WEBHOOK_HTTP = "the URL must be https (http only to a loopback address, where webhooks.allow_private_addresses is on)"


def is_loopback_host(host: str | None) -> bool:
    """True for `localhost`, `*.localhost`, any 127.0.0.0/8 address and ::1 (brackets allowed)."""
    if not host:
        return False
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    address = ip_literal(host)
    return address is not None and address.is_loopback


def is_public_address(address: IPAddress) -> bool:
    """Whether `address` is global unicast (an IPv4-mapped IPv6 address judged as its IPv4 address): where an
    outbound connection may go when private addresses are not allowed."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def ip_literal(host: str) -> IPAddress | None:
    """The address `host` spells, or None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


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


def webhook_url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why `url` may not be a webhook endpoint, or None. https only (http only to a loopback host, and only when
    private addresses are allowed); no credentials, fragment or odd port; an IP literal must be public unless
    private addresses are allowed. Host names are checked again, by address, before every attempt."""
    if len(url) > MAX_WEBHOOK_URL_LENGTH:
        return f"the URL is longer than {MAX_WEBHOOK_URL_LENGTH} characters"
    if not url.isascii() or not url.isprintable() or " " in url:
        return "this is not a URL: it has a space or a character that is not printable ASCII (an https://host/... URL)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "the URL cannot be read"
    return _webhook_form_problem(parts, port) or _webhook_destination_problem(parts, allow_private)


def _webhook_form_problem(parts: SplitResult, port: int | None) -> str | None:
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "the URL must be https://host/..."
    if parts.username is not None or parts.password is not None:
        return "the URL must not carry credentials"
    if parts.fragment:
        return "the URL must not have a fragment"
    if port == 0:
        return "the URL's port is not valid"
    return None


def _webhook_destination_problem(parts: SplitResult, allow_private: bool) -> str | None:
    loopback = is_loopback_host(parts.hostname)
    if allow_private:
        return None if parts.scheme == "https" or loopback else _WEBHOOK_HTTP
    if parts.scheme == "http":
        return _WEBHOOK_HTTP
    if loopback:
        return "the URL points to this host (webhooks.allow_private_addresses is off)"
    address = ip_literal(parts.hostname or "")
    if address is not None and not is_public_address(address):
        return "the URL points to a private or reserved address (webhooks.allow_private_addresses is off)"
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
