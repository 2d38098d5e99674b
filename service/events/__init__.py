"""Events about elicitations, delivered to whoever waits on them: in this process (`LocalBus`)."""

from .bus import Listener, LocalBus

__all__ = ["Listener", "LocalBus"]
