"""Test helpers for agents that use the connector: a mock OAuth provider (respx) and a scripted browser."""

from .browser import ScriptedBrowser
from .mock_provider import MockOAuthProvider

__all__ = ["MockOAuthProvider", "ScriptedBrowser"]
