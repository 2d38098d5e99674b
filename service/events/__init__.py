"""Events about elicitations, delivered to whoever waits on them: in this process (`LocalBus`), and from other
processes through the event log (`OutboxFeed`)."""

from .bus import Listener, LocalBus, Waiter
from .feed import OutboxFeed

__all__ = ["Listener", "LocalBus", "OutboxFeed", "Waiter"]
