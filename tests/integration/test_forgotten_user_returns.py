"""A user forgotten who comes back is charged again for what costs again.

Ledger entry ids derive from the memory's runs and turns; the forgotten memory's rows stay in
the ledger under a pseudonym. Re-sent with the same event ids, the user's observations
derive the same run and the same entry ids: the anonymised rows must not take them.
"""

from __future__ import annotations

from contextlib import closing

import pytest

from memoryd import wiring
from memoryd.erasure import ErasureRequest
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

MIRA = key_of("mira", "org-a")


def ledger_rows(deployment: Deployment, user: str) -> int:
    [(n,)] = deployment.query(
        "SELECT count(*) FROM credit_ledger WHERE organization_id = 'org-a' AND user_id = %s",
        (user,),
    )
    return int(n)


def test_a_returning_users_runs_are_booked_again(deployment: Deployment) -> None:
    observation = make_event("mira", "I keep bees on the roof of the library", org="org-a")
    deployment.publish([observation])
    deployment.run_both()
    booked = ledger_rows(deployment, "mira")
    assert booked > 0
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        receipt = wiring.eraser(c, pub).forget(MIRA, ErasureRequest("test", "asked"))
    assert ledger_rows(deployment, "mira") == 0
    pseudonym = f"erased:{receipt.erasure_id}"
    assert ledger_rows(deployment, pseudonym) == booked

    deployment.publish([observation])  # the same event, after the forget
    deployment.run_both()
    [(runs,)] = deployment.query(
        "SELECT count(*) FROM consolidation_runs WHERE organization_id = 'org-a'"
        " AND user_id = 'mira'"
    )
    assert runs == 1
    assert ledger_rows(deployment, "mira") == booked
    assert ledger_rows(deployment, pseudonym) == booked
