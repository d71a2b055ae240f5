"""The API's shutdown steps (the read path's close, then the Kafka publisher's): a step that
raises must not leave the later ones undone, a publisher holding records unclosed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from memoryd.api.app import create_app


def test_every_shutdown_step_runs_in_order_when_one_before_it_raises() -> None:
    ran: list[str] = []

    def failing() -> None:
        ran.append("read path")
        raise RuntimeError("read path close failed")

    app = create_app(None, on_shutdown=(failing, lambda: ran.append("publisher")))
    with pytest.raises(RuntimeError, match="read path close failed"), TestClient(app):
        pass
    assert ran == ["read path", "publisher"]
