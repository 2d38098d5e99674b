"""Issuer identifiers: exact comparison (OpenID Connect, RFC 9207) and the issuer a discovery URL implies."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from service.providers import TENANT_ID_PLACEHOLDER

_TENANT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")


def issuer_matches(expected: str, received: str, *, tenant_id: str | None = None) -> bool:
    """Whether `received` is the expected issuer: exact string equality (OpenID Connect, RFC 9207).

    An `expected` with `{tenantid}` accepts any tenant id in that place, or exactly `tenant_id` when given.
    """
    if TENANT_ID_PLACEHOLDER not in expected:
        return received == expected
    prefix, _, suffix = expected.partition(TENANT_ID_PLACEHOLDER)
    if not (received.startswith(prefix) and received.endswith(suffix)) or len(received) < len(prefix) + len(suffix):
        return False
    tenant = received[len(prefix) : len(received) - len(suffix)]
    if not _TENANT_ID_RE.fullmatch(tenant):
        return False
    return tenant_id is None or tenant == tenant_id


def implied_issuer(discovery_url: str) -> str | None:
    """The issuer a discovery URL implies (OIDC Discovery 1.0 §4, RFC 8414 §3), if of a known form."""
    parts = urlsplit(discovery_url)
    oidc_suffix = "/.well-known/openid-configuration"
    if parts.path.endswith(oidc_suffix):
        return f"{parts.scheme}://{parts.netloc}{parts.path[: -len(oidc_suffix)]}"
    rfc8414_prefix = "/.well-known/oauth-authorization-server"
    if parts.path == rfc8414_prefix or parts.path.startswith(rfc8414_prefix + "/"):
        return f"{parts.scheme}://{parts.netloc}{parts.path[len(rfc8414_prefix) :]}"
    return None


def same_issuer(a: str, b: str) -> bool:
    """Issuers compared as discovery documents state them (a trailing slash is not a difference)."""
    return a.rstrip("/") == b.rstrip("/")
