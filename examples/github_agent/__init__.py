"""An ACP agent over stdio that lists the user's GitHub repositories, with access granted through the connector."""

from .agent import GitHubAgent, main, run

__all__ = ["GitHubAgent", "main", "run"]
