"""Chat turns' reads on their own few threads of the API, on real Kafka, Postgres and Chroma."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.settings import ApiSettings
from tests.support.builders import make_fact
from tests.support.deployment import Deployment, seed_core

pytestmark = pytest.mark.integration

TOKEN = "token-for-org-a"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def test_turns_beyond_the_turn_threads_wait_and_other_routes_do_not(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = deployment.settings.model_copy(
        update={"api": ApiSettings(tokens={hash_token(TOKEN): "org-a"}, turn_threads=2)}
    )
    with wiring.core(settings) as c, wiring.api_app(c) as app, TestClient(app) as client:
        seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
        service = app.state.deps.context
        assemble = service.assemble
        lock = threading.Lock()
        inside: list[int] = []
        both_in = threading.Event()
        go_on = threading.Event()

        def held_assemble(*args: Any, **kwargs: Any) -> Any:
            with lock:
                inside.append(len(inside) + 1)
                if len(inside) == 2:
                    both_in.set()
            go_on.wait(30)
            return assemble(*args, **kwargs)

        monkeypatch.setattr(service, "assemble", held_assemble)
        body = {"user_id": "ada", "query": "coffee"}
        with ThreadPoolExecutor(5) as turns:
            answers = [
                turns.submit(client.post, "/v1/context", json=body, headers=HEADERS)
                for _ in range(5)
            ]
            assert both_in.wait(30)
            # Two turns hold both turn threads: the other three wait, holding none, and the
            # other routes still answer.
            memory = client.get("/v1/users/ada/memory", headers=HEADERS)
            assert memory.status_code == 200
            assert len(inside) == 2
            go_on.set()
            facts = [a.result(timeout=60).json()["facts"] for a in answers]
    assert len(inside) == 5
    assert all(
        [f["fact"]["content"] for f in shown] == ["Ada takes her coffee black"] for shown in facts
    )
