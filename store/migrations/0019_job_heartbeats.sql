-- A cluster job's run beats while it runs: `last_heartbeat_at`, written every 30 s by the
-- process running it. A run left "running" is due again only once its heartbeat is old: its
-- process is gone. Its lock alone could not say so: a lock connection dropped (an idle
-- timeout, a failover) frees the lock while the run goes on, and a second run would start.
ALTER TABLE scheduled_jobs ADD COLUMN last_heartbeat_at timestamptz;
