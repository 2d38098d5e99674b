"""Using a stored grant: `TokenAccess` (find, decrypt, refresh single-flight, disconnect), `GrantAuth`, and
`ProactiveRefresh` (tokens of grants in use refreshed ahead of their expiry)."""

from .access import REFRESH_AHEAD_MAX_SECONDS, REFRESH_AHEAD_SHARE, TokenAccess, refresh_margin
from .auth import GrantAuth, api_origin
from .proactive import ProactiveRefresh
from .refresh import EventBus, grant_aad_of

__all__ = [
    "REFRESH_AHEAD_MAX_SECONDS",
    "REFRESH_AHEAD_SHARE",
    "EventBus",
    "GrantAuth",
    "ProactiveRefresh",
    "TokenAccess",
    "api_origin",
    "grant_aad_of",
    "refresh_margin",
]
