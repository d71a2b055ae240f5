"""Versioned SQL migrations, applied in order, once, under an advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from psycopg_pool import ConnectionPool

from store.errors import MigrationError
from store.postgres import translated

# Any 64-bit constant works; it only has to differ from the other advisory locks we take.
MIGRATION_LOCK_KEY = 0x6D656D6F72796431
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def bundled_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("store.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration versions must be 1..n without gaps, got {versions}")
    return found


def migrate(pool: ConnectionPool, target: int | None = None) -> list[Migration]:
    """Apply what is missing (up to version `target`, default all); returns what this applied."""
    applied: list[Migration] = []
    with translated("migration", MigrationError), pool.connection() as conn:
        conn.autocommit = True
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for migration in bundled_migrations():
                if migration.version in done:
                    continue
                if target is not None and migration.version > target:
                    break
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
            conn.autocommit = False
    return applied
