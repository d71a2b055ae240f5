"""What each API worker process is built with."""

from __future__ import annotations

import pytest

from memoryd.api.serve import worker_settings
from memoryd.settings import Settings


def test_a_worker_runs_the_embedding_model_on_one_thread_by_default() -> None:
    assert Settings().embedding_threads == 0  # one per core, in other processes
    assert worker_settings(Settings()).embedding_threads == 1


@pytest.mark.parametrize("threads", [0, 3])
def test_an_embedding_threads_setting_is_kept(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORYD_EMBEDDING_THREADS", str(threads))
    assert worker_settings(Settings()).embedding_threads == threads
