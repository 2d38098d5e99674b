"""The user an MCP request acts for: the verified identity the server's own authorization established.

On streamable HTTP behind MCP's authorization (an OAuth 2.1 bearer the server's `TokenVerifier` accepted), the SDK
holds the verified `AccessToken` for the request; its subject at its issuer is the user. Nothing the client sends in
a tool's arguments, a header or `_meta` counts: the connect page later checks that the person in the browser is this
user.
"""

from __future__ import annotations

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken

from service.core.identity import Identity

from .errors import NoVerifiedUser


def user_from_access_token(issuer: str, token: AccessToken | None = None) -> Identity:
    """The identity `(issuer, sub)` of the request's verified bearer (`token`, default: the SDK's for this request).

    `issuer` is the authorization server the MCP server trusts (its `AuthSettings.issuer_url`). A token whose `iss`
    claim names another issuer, a token without a subject, or no verified token at all raises `NoVerifiedUser`.
    """
    token = token if token is not None else get_access_token()
    if token is None:
        raise NoVerifiedUser("the request carries no verified bearer token")
    if not token.subject:
        raise NoVerifiedUser("the verified bearer token names no subject")
    claimed = (token.claims or {}).get("iss")
    if claimed is not None and claimed != issuer:
        raise NoVerifiedUser("the verified bearer token was issued by another authorization server")
    return Identity(issuer, token.subject)
