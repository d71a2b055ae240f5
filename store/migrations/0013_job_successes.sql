-- A cluster job's row kept only its last run: a job that fails every time, or was left
-- 'running' by a crash, showed no age, so "has not succeeded for a day" could not be measured.
-- Now the row also keeps when the job last succeeded and when it was first started.
ALTER TABLE scheduled_jobs
    ADD COLUMN last_succeeded_at timestamptz,
    ADD COLUMN first_started_at  timestamptz;
UPDATE scheduled_jobs SET
    last_succeeded_at = CASE WHEN last_outcome = 'succeeded' THEN last_finished_at END,
    first_started_at = last_started_at;
ALTER TABLE scheduled_jobs ALTER COLUMN first_started_at SET NOT NULL;
