-- A maintenance run leaves a memory alone while an erasure of it is open, and the duplicate
-- sweep visits only memories changed since its last run: a memory left alone was never
-- visited again once its erasure completed. A run now records how many memories it left
-- for a later one, and the sweep looks back to its last run that left none.
ALTER TABLE maintenance_runs ADD COLUMN skipped integer NOT NULL DEFAULT 0;
