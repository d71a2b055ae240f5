"""The keepalives the pool adds to a DSN: never over what the operator set, in the DSN, in
libpq's environment or in a service file."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from store.errors import StoreError
from store.postgres import with_keepalives


def test_keepalives_are_added_where_the_dsn_sets_none_of_its_own() -> None:
    added = conninfo_to_dict(with_keepalives("postgresql://u@db:5432/memoryd?keepalives_idle=5"))
    assert (added["host"], added["dbname"], added["keepalives_idle"]) == ("db", "memoryd", "5")
    assert (added["keepalives"], added["keepalives_count"], added["connect_timeout"]) == (
        "1",
        "3",
        "10",
    )


def test_a_dsn_naming_a_service_file_is_left_as_it_is() -> None:
    assert with_keepalives("service=memoryd") == "service=memoryd"


def test_a_dsn_libpq_cannot_parse_is_refused_at_once_naming_why() -> None:
    # Passed on, the pool would try it for its whole start-up timeout and report an outage.
    with pytest.raises(StoreError, match='cannot be parsed: missing "=" after "port"'):
        with_keepalives("host=db port")


def test_libpq_environment_connect_timeout_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    assert "connect_timeout" not in conninfo_to_dict(with_keepalives("host=db"))
    monkeypatch.setenv("PGSERVICE", "memoryd")
    assert with_keepalives("host=db") == "host=db"
