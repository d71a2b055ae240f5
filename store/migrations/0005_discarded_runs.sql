-- Batch splitting: when the model cannot answer a batch usably, the processor bisects it to
-- find the event at fault. A probe that is answered usably is not applied (the good events
-- are consolidated together afterwards), but it was paid for: it is recorded as a
-- 'discarded' run, with its tokens, and booked in the credit ledger like any other call.

ALTER TABLE consolidation_runs DROP CONSTRAINT consolidation_runs_status_check;
ALTER TABLE consolidation_runs ADD CONSTRAINT consolidation_runs_status_check CHECK (status IN (
    'succeeded', 'failed', 'deferred', 'discarded'));
