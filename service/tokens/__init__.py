"""Using a stored grant: `TokenAccess` (find, decrypt, refresh single-flight, disconnect), the auth that carries a
grant (`GrantAuth` for OAuth tokens, `CredentialAuth` for API keys; `grant_auth` picks; `secret_headers` names the
headers they write it into), and `ProactiveRefresh` (tokens of grants in use refreshed ahead of their expiry)."""

from .access import REFRESH_AHEAD_MAX_SECONDS, REFRESH_AHEAD_SHARE, TokenAccess, refresh_margin
from .auth import CredentialAuth, GrantAuth, api_origin, grant_auth, secret_headers
from .proactive import ProactiveRefresh
from .refresh import EventBus, grant_aad_of, unreadable_error

__all__ = [
    "REFRESH_AHEAD_MAX_SECONDS",
    "REFRESH_AHEAD_SHARE",
    "CredentialAuth",
    "EventBus",
    "GrantAuth",
    "ProactiveRefresh",
    "TokenAccess",
    "api_origin",
    "grant_aad_of",
    "grant_auth",
    "refresh_margin",
    "secret_headers",
    "unreadable_error",
]
