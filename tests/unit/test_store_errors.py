"""Which driver errors the store says may be retried: an outage or a refusal an operator fixes
is `DatabaseUnavailable`; a statement that can never succeed is a plain `StoreError`."""

from __future__ import annotations

import psycopg
import psycopg.errors as pg
import pytest

from store.errors import DatabaseRefused, DatabaseUnavailable, StoreError
from store.postgres import translated


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (psycopg.OperationalError("server closed the connection"), DatabaseUnavailable),
        (
            pg.AdminShutdown("terminating connection due to administrator command"),
            DatabaseUnavailable,
        ),
        (pg.InsufficientPrivilege("permission denied for table context_events"), DatabaseRefused),
        (pg.DiskFull("could not extend file: No space left on device"), DatabaseUnavailable),
        (pg.TooManyConnections("sorry, too many clients already"), DatabaseUnavailable),
        # A failover to a demoted node, a pooler routing to a replica: waited out, not the
        # work's fault.
        (
            pg.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
            DatabaseRefused,
        ),
        # The append-only triggers raise insufficient_privilege too: that is no outage.
        (pg.InsufficientPrivilege("context_events is append-only: UPDATE rejected"), StoreError),
        (pg.UniqueViolation("duplicate key value"), StoreError),
        (pg.UndefinedColumn("column x does not exist"), StoreError),
    ],
)
def test_driver_errors_become_the_store_error_of_their_condition(
    error: psycopg.Error, expected: type[StoreError]
) -> None:
    with pytest.raises(StoreError) as raised, translated("append"):
        raise error
    assert type(raised.value) is expected
    assert raised.value.__cause__ is error
