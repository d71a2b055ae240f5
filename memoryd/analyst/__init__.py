"""The analyst commands: `memoryd history`, `memoryd replay` and `memoryd export`.

`commands` parses and runs them, `render` turns their results into text and JSON, `export`
builds and writes a user's export. Every one of them reads Postgres through a connection whose
transactions are READ ONLY (`store.write.run_log.read_only_dsn`): whatever goes wrong, none of
them can change live memory.
"""
