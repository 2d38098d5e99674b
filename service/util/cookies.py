"""Outbound HTTP clients shared by many users or tenants keep no cookies.

httpx stores every `Set-Cookie` of a response in the client's jar and sends it on every later request to that
host. On a client shared by all users of a provider (token requests, the token proxy) or by every tenant's webhook
endpoints, that would carry one user's provider session into another user's requests.
"""

from __future__ import annotations

from http.cookiejar import CookieJar, DefaultCookiePolicy


def refusing_cookie_jar() -> CookieJar:
    """A jar that accepts and returns no cookie (`allowed_domains` empty: no domain is allowed)."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
