"""Tool results and per-connection context, published by the services that run the tools."""

from __future__ import annotations

from producers._user_events import UserEventClient, derived_key
from producers.contract import (
    MAX_CONTENT_CHARS,
    ContextEvent,
    EventType,
    Source,
    SourceMetadata,
    utc_now,
)


class ToolContextPublisher(UserEventClient):
    def index_tool_output(
        self,
        content: str,
        *,
        tool_id: str,
        connection_id: str | None = None,
        message_id: str | None = None,
        attachment_id: str | None = None,
        filename: str | None = None,
    ) -> list[ContextEvent]:
        """Index a tool result or an attachment's text, split into contract-sized chunks.

        Ids derive from (tool, connection, message, attachment, chunk) when the caller names
        the message or attachment, so re-indexing the same output is a no-op downstream, and
        two mailboxes' message "1" are two messages.
        """
        if not content.strip():
            raise ValueError("tool output is empty")
        chunks = _chunks(content, MAX_CONTENT_CHARS)
        stable = message_id is not None or attachment_id is not None
        meta = SourceMetadata(
            source=Source.TOOL,
            tool_id=tool_id,
            connection_id=connection_id,
            message_id=message_id,
            attachment_id=attachment_id,
            filename=filename,
        )
        now = utc_now()

        def key(i: int) -> str | None:
            parts = (self._user_id, tool_id, connection_id, message_id, attachment_id, i)
            return derived_key(*parts) if stable else None

        events = [
            self._event(EventType.TOOL_OUTPUT, chunk, meta, key=key(i), at=now)
            for i, chunk in enumerate(chunks)
        ]
        self._publisher.publish(events)
        return events

    def update_connection_context(self, connection_id: str, learned_info: str) -> ContextEvent:
        """Add to what memoryd knows about one tool connection (e.g. a mailbox, a CRM)."""
        meta = SourceMetadata(source=Source.TOOL, connection_id=connection_id)
        event = self._event(EventType.CONNECTION_UPDATE, learned_info, meta)
        self._publisher.publish([event])
        return event


def _chunks(text: str, size: int) -> list[str]:
    """Split on paragraph, then line, then hard boundaries so no chunk exceeds `size`."""
    out: list[str] = []
    current = ""
    for paragraph in text.split("\n\n"):
        piece = paragraph if not current else "\n\n" + paragraph
        if len(current) + len(piece) <= size:
            current += piece
            continue
        if current:
            out.append(current)
        current = ""
        rest = paragraph
        while len(rest) > size:
            out.append(rest[:size])
            rest = rest[size:]
        current = rest
    if current.strip():
        out.append(current)
    return out
