-- A cluster job's runs are numbered: `run_epoch` goes up by one as each run starts, and every
-- transaction of a run first checks, holding the row FOR SHARE, that the number is still its
-- own. The job's advisory lock cannot fence its writes: a lock connection dropped (a pooler
-- restarted, an idle timeout) frees the lock while the run goes on through other connections,
-- and a second run may start. The second run's increment waits for the first run's open
-- transactions, and refuses every one after it.
ALTER TABLE scheduled_jobs ADD COLUMN run_epoch bigint NOT NULL DEFAULT 0;
