-- The read path: richer audit rows, pinned-fact lookups, and the fact_retraction event type
-- (a user deleting or correcting one fact through the API; see processors/retraction.py).

ALTER TABLE context_events DROP CONSTRAINT context_events_event_type_check;
ALTER TABLE context_events ADD CONSTRAINT context_events_event_type_check CHECK (event_type IN (
    'fact', 'preference', 'project_details', 'correction', 'scaffold_update', 'learned_fact',
    'tool_output', 'connection_update', 'fact_retraction'));

ALTER TABLE context_logs
    ADD COLUMN budget          text,
    ADD COLUMN rewritten_query text,
    ADD COLUMN connection_ids  text[]  NOT NULL DEFAULT '{}',
    ADD COLUMN degraded_reason text;

CREATE INDEX memory_facts_user_pinned ON memory_facts (user_id) WHERE pinned;
