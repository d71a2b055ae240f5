"""The system of record in Postgres: the event log, memory state, runs and the ledger."""
