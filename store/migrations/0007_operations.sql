-- Operations: cluster-wide scheduled jobs, the maintenance audit, retention.

-- One row per cluster-wide job: when it last ran anywhere in the cluster. A process that wins
-- the job's advisory lock runs it only when the last run is older than the job's interval, so
-- adding processor instances never multiplies a job.
CREATE TABLE scheduled_jobs (
    job              text        PRIMARY KEY,
    last_started_at  timestamptz NOT NULL,
    last_finished_at timestamptz,
    last_outcome     text,
    last_error       text
);

-- Every maintenance job execution, whatever it changed: the cluster-level audit. Memory changes
-- are also written as per-user runs in consolidation_runs (backend 'maintenance'), so a fold
-- of the runs sees them.
CREATE TABLE maintenance_runs (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       uuid        NOT NULL UNIQUE,
    job          text        NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    outcome      text        NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    users        integer     NOT NULL DEFAULT 0,
    changes      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    parameters   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error        text
);
CREATE TRIGGER maintenance_runs_append_only
    BEFORE UPDATE OR DELETE ON maintenance_runs
    FOR EACH ROW EXECUTE FUNCTION reject_log_mutation();

-- Retention deletes old read audit rows by age.
CREATE INDEX context_logs_created ON context_logs (created_at);
