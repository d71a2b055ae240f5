-- Which transaction last wrote each fact row, so a reader holding a memory's facts as of one
-- snapshot can ask for only the rows written since: those whose writer its snapshot did not
-- see (`pg_visible_in_snapshot`). That covers a transaction in flight when the snapshot was
-- taken and committed after it, which a comparison of timestamps or sequence numbers misses.
-- A trigger sets it, so no writer (a run, the indexer, an erasure's unlinking of a
-- successor) can forget to. Rows written before this migration keep NULL: every snapshot
-- taken since sees them. Deletions leave no row; a reader notices them by the memory's count.
ALTER TABLE memory_facts ADD COLUMN written_by xid8;

CREATE FUNCTION memoryd_fact_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.written_by := pg_current_xact_id();
    RETURN NEW;
END;
$$;

CREATE TRIGGER memory_facts_written_by
    BEFORE INSERT OR UPDATE ON memory_facts FOR EACH ROW EXECUTE FUNCTION memoryd_fact_written();

CREATE INDEX memory_facts_memory_written_by
    ON memory_facts (organization_id, user_id, written_by);
