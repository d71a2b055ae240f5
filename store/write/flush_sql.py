"""What a flush reads under the memory lock (`PostgresMemoryStore.locked_reads`, in one
pipeline), each also read on its own."""

from domain.erasure import REDACTED_JSON, REDACTION
from store import fact_rows

MEMORY = "organization_id = %s AND user_id = %s"
# The state columns, then the generation: a flush reads both of the one row at once.
STATE = f"SELECT {fact_rows.STATE_COLUMNS}, generation FROM user_memory WHERE {MEMORY}"
CONSUMED = f"SELECT event_id FROM consolidated_events WHERE {MEMORY} AND event_id = ANY(%s)"


def redacted(content: str) -> str:
    """Whether a logged event's `content` (a column) is what a fact erasure wrote over its
    text: the flush drops such an event, so it is settled, never pending or parked."""
    return f"{content} IN ('{REDACTION}', '{REDACTED_JSON}')"


# A logged event a fact erasure redacted (its text was the erased fact's).
REDACTED_CONTENT = redacted("content")
# Of the batch's events, those redacted in the log since they were published: the copy read
# from Kafka still says what was erased.
ERASED_EVENTS = (
    f"SELECT event_id FROM context_events WHERE {MEMORY} AND event_id = ANY(%s)"
    f" AND {REDACTED_CONTENT}"
)
CUTOFFS = "SELECT topic, partition, cutoff FROM memory_cutoffs WHERE subject = %s"
ERASURE_OPEN = f"SELECT EXISTS (SELECT 1 FROM erasure_pending WHERE {MEMORY} AND fact_id IS NULL)"
BALANCE = (
    "SELECT c.credit_micro_usd - coalesce((SELECT sum(cost_micro_usd)"
    " FROM credit_ledger l WHERE l.organization_id = c.organization_id"
    " AND l.user_id = c.user_id), 0)"
    " FROM user_credits c WHERE c.organization_id = %s AND c.user_id = %s"
)
