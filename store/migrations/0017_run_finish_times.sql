-- A run's finished_at defaulted to now(), the start of its transaction: a flush's transaction
-- starts before it waits for its memory's row, so a run committed after a time T could carry
-- a finished_at before T, and "memory at T" (memoryd history --at) included it. The run's
-- record is now the last row its transaction writes, stamped with the clock when it is
-- written: finished_at is the commit's time but for the commit itself.
ALTER TABLE consolidation_runs ALTER COLUMN finished_at SET DEFAULT clock_timestamp();
