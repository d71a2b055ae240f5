"""How current memory is: the oldest logged event that no run has consolidated yet.

An event stays pending until a run lists it in `consolidated_events`, or until a failed or
deferred run lists it (it is then parked on the dead-letter topic for `memoryd redrive`, and
counted apart: it waits for an operator, not for the pipeline), or until a fact erasure
redacts its text in the log (a flush drops it: it waits for nothing, parked or not, as the
analyst's invariants count it). All three are permanent, so everything below the first
still-pending event is settled for good, and the probe remembers that point as a watermark
instead of scanning the whole log on every measurement.

A discarded run parks nothing: its answer was not applied (a bisection's probe, a run
planned on a version another run changed first) and its events go on to another run.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from store.postgres import transaction
from store.write.flush_sql import redacted

# A row may commit after rows with higher seq (identity values are taken at insert time):
# the watermark never passes rows younger than this, so a late commit is never skipped.
SETTLE_S = 60

# The runs whose events are parked on the dead-letter topic.
_PARKING = "r.status IN ('failed', 'deferred')"

# A logged event e still waiting for the pipeline: not consolidated, not redacted by a fact
# erasure (a flush drops it), not parked by a failed run.
_WAITING = f"""
  AND NOT {redacted("e.content")}
  AND NOT EXISTS (
      SELECT 1 FROM consolidated_events c
      WHERE (c.organization_id, c.user_id, c.event_id) = (e.organization_id, e.user_id, e.event_id))
  AND NOT EXISTS (
      SELECT 1 FROM consolidation_runs r
      WHERE (r.organization_id, r.user_id) = (e.organization_id, e.user_id)
        AND {_PARKING} AND r.input_event_ids @> ARRAY[e.event_id])
"""

_FIRST_PENDING = f"""
SELECT e.seq, extract(epoch FROM now() - e.recorded_at)::float8
FROM context_events e
WHERE e.seq > %(after)s {_WAITING}
ORDER BY e.seq
LIMIT 1
"""

_PENDING_COUNT = f"""
SELECT count(*) FROM context_events e
WHERE e.seq >= %(from)s {_WAITING}
"""

_SETTLED_MAX = """
SELECT coalesce(max(seq), %(after)s) FROM context_events
WHERE seq > %(after)s AND recorded_at < now() - make_interval(secs => %(settle)s)
"""

_PARKED = f"""
SELECT count(*) FROM (
    SELECT DISTINCT r.organization_id, r.user_id, id
    FROM consolidation_runs r, unnest(r.input_event_ids) AS id
    WHERE {_PARKING}
      AND EXISTS (
          SELECT 1 FROM context_events e
          WHERE (e.organization_id, e.user_id, e.event_id) = (r.organization_id, r.user_id, id)
            AND NOT {redacted("e.content")})
      AND NOT EXISTS (
          SELECT 1 FROM consolidated_events c
          WHERE (c.organization_id, c.user_id, c.event_id) = (r.organization_id, r.user_id, id))
) parked
"""


@dataclass(frozen=True)
class Freshness:
    oldest_pending_age_s: float  # 0 when nothing waits
    pending: int  # logged, waiting for the pipeline (parked ones not included)
    parked: int  # logged, not consolidated, listed by a failed or deferred run


class FreshnessProbe:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._watermark = 0

    def measure(self) -> Freshness:
        with transaction(self._pool) as conn:
            first = conn.execute(_FIRST_PENDING, {"after": self._watermark}).fetchone()
            settled_row = conn.execute(
                _SETTLED_MAX, {"after": self._watermark, "settle": SETTLE_S}
            ).fetchone()
            settled = int(settled_row[0]) if settled_row else self._watermark
            if first is not None:
                settled = min(settled, int(first[0]) - 1)
            pending_row = conn.execute(_PENDING_COUNT, {"from": self._watermark + 1}).fetchone()
            parked_row = conn.execute(_PARKED).fetchone()
        self._watermark = max(self._watermark, settled)
        return Freshness(
            oldest_pending_age_s=max(0.0, float(first[1])) if first else 0.0,
            pending=int(pending_row[0]) if pending_row else 0,
            parked=int(parked_row[0]) if parked_row else 0,
        )
