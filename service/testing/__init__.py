"""Test helpers for agents that use the connector: a mock OAuth provider (or one emulating a catalog entry), a mock
API-key API, a scripted browser, a scripted ACP client."""

from .acp_client import Answer, Elicitation, Reply, ScriptedClient, memory_transport_pair, spawn_agent
from .browser import ScriptedBrowser
from .mock_keyed import MockKeyedApi
from .mock_like import EmulatedProvider
from .mock_oidc import MockOIDCProvider
from .mock_provider import MockOAuthProvider

__all__ = [
    "Answer",
    "Elicitation",
    "EmulatedProvider",
    "MockKeyedApi",
    "MockOAuthProvider",
    "MockOIDCProvider",
    "Reply",
    "ScriptedBrowser",
    "ScriptedClient",
    "memory_transport_pair",
    "spawn_agent",
]
