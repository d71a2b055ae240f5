-- A chat turn counts the facts it showed (recall_count, last_recalled_at). Counted in
-- memory_facts, every turn wrote new versions of a dozen of its wide rows (about 3,000 a second
-- at 16 clients), and autovacuum ran VACUUM ANALYZE on the whole table once a minute for it
-- (BENCHMARKS.md, "Where the slow seconds fall"). Counted here, a turn writes narrow rows, and
-- memory_facts changes only when a run, the indexer or an erasure changes a fact.
--
-- memory_facts.recall_count and last_recalled_at keep what a fact was stored with (an import,
-- the counts before this migration); a fact's recalls are the two together, as the view
-- memory_fact_rows shows them. The rows go with their fact (ON DELETE CASCADE): an erasure
-- leaves none behind.
CREATE TABLE fact_recalls (
    fact_id          uuid        PRIMARY KEY REFERENCES memory_facts (fact_id) ON DELETE CASCADE,
    recall_count     integer     NOT NULL,
    last_recalled_at timestamptz NOT NULL
);

-- memory_facts as the code reads it: every column, the recalls added up.
CREATE VIEW memory_fact_rows AS
SELECT
    f.fact_id, f.user_id, f.organization_id, f.content, f.content_tsv, f.context_type, f.source,
    f.connection_id, f.tool_id, f.message_id, f.attachment_id, f.filename, f.source_event_ids,
    f.fact_type, f.surface, f.status, f.pinned, f.confidence, f.salience, f.reinforce_count,
    f.last_reinforced_at,
    f.recall_count + coalesce(r.recall_count, 0) AS recall_count,
    greatest(f.last_recalled_at, r.last_recalled_at) AS last_recalled_at,
    f.superseded_by, f.created_by_run, f.updated_by_run, f.created_at, f.updated_at,
    f.indexed_at, f.version, f.observed_at, f.event_date, f.subject
FROM memory_facts f
LEFT JOIN fact_recalls r USING (fact_id);
