"""Events about elicitations and grants, delivered to whoever waits on them: in this process (`LocalBus`), from
other processes through the event log (`OutboxFeed`), at once across the replicas of a PostgreSQL database
(`PgBus`, LISTEN/NOTIFY); and this process as one of those replicas (`Replica`)."""

from .bus import Listener, LocalBus, Waiter
from .feed import OutboxFeed
from .pg import PgBus
from .replica import Replica
from .webhooks import HttpWebhookSender, WebhookWorker

__all__ = ["HttpWebhookSender", "Listener", "LocalBus", "OutboxFeed", "PgBus", "Replica", "Waiter", "WebhookWorker"]
