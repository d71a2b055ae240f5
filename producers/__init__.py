"""The event contract and the clients that chat, inbox and tool services embed.

Light on purpose: nothing here imports Postgres, Chroma or an LLM SDK.
"""

from producers.chat import RECORD_OBSERVATION_TOOL, ChatObservations, ChatScope
from producers.contract import SCHEMA_VERSION, ContextEvent, EventType, Source, SourceMetadata
from producers.errors import ProducerError, PublishError
from producers.inbox import InboxContextUpdates
from producers.publisher import EventPublisher, KafkaEventPublisher, ProducerSettings
from producers.tools import ToolContextPublisher

__all__ = [
    "RECORD_OBSERVATION_TOOL",
    "SCHEMA_VERSION",
    "ChatObservations",
    "ChatScope",
    "ContextEvent",
    "EventPublisher",
    "EventType",
    "InboxContextUpdates",
    "KafkaEventPublisher",
    "ProducerError",
    "ProducerSettings",
    "PublishError",
    "Source",
    "SourceMetadata",
    "ToolContextPublisher",
]
