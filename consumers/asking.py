"""A flush's way to the backend's answers: the one kept from a try whose writes the database
refused (`consumers.kept_answers`), else a call. An unusable answer becomes a failed run,
recorded once however often its record is tried, and is raised."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence

from consumers.foreground import ForegroundWork
from consumers.kept_answers import KeptAnswer, KeptAnswers, KeptFailure
from consumers.observers import FlushObserver
from consumers.unapplied_runs import UnappliedRuns
from domain.model import MemoryState
from processors.consolidate import Consolidator
from processors.errors import UnusableAnswer
from processors.schema import ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent

# A request for the events, and the candidate search's degradation when it was built.
Build = Callable[[], tuple[ConsolidationRequest, str | None]]


class Asking:
    def __init__(
        self,
        backend: ConsolidationBackend,
        consolidator: Consolidator,
        foreground: ForegroundWork,
        kept: KeptAnswers,
        unapplied: UnappliedRuns,
        observer: FlushObserver,
    ) -> None:
        self._backend = backend
        self._consolidator = consolidator
        self._foreground = foreground
        self._kept = kept
        self._unapplied = unapplied
        self._observer = observer
        self._answers = 0
        self._lock = threading.Lock()  # flushes of several memories call at once

    @property
    def answers(self) -> int:
        """The backend's answers (usable or not) so far: each says it is up."""
        with self._lock:
            return self._answers

    def ask(
        self,
        state: MemoryState,
        events: Sequence[ContextEvent],
        attempt: int,
        generation: uuid.UUID | None,
        build: Build,
        *,
        probe: bool = False,
    ) -> KeptAnswer:
        """The usable answer to `events` on `state`, asked as a bisection's `probe` or not.
        Raises UnusableAnswer once its failed run is recorded."""
        ids = (e.event_id for e in events)
        answer = self._kept.take(state.key, state.version, ids, probe=probe)
        if answer is None:
            request, degraded = build()
            answer = self._call(request, degraded, generation, probe)
            self._kept.made(answer)
        if isinstance(answer, KeptAnswer):
            return answer
        if not self._kept.booked(answer):
            self._unapplied.failed(
                answer.request, attempt, answer.error, answer.duration_ms, answer.run_id
            )
            self._kept.book(answer)
        raise answer.error.with_traceback(None)

    def _call(
        self,
        request: ConsolidationRequest,
        degraded: str | None,
        generation: uuid.UUID | None,
        probe: bool,
    ) -> KeptAnswer | KeptFailure:
        started = time.monotonic()
        try:
            with self._foreground.waiting():
                response = self._backend.consolidate(request)
            # Here, not only in `plan`: a bisection's probe must refuse the same answers.
            self._consolidator.check(request, response)
        except UnusableAnswer as e:
            self._answered(probe, usable=False)
            return KeptFailure(request, e, _ms_since(started), generation, probe)
        self._answered(probe, usable=True)
        return KeptAnswer(request, response, _ms_since(started), degraded, generation, probe)

    def _answered(self, probe: bool, *, usable: bool) -> None:
        # Counted here, where the backend answered: a probe's answer kept from a refused write
        # and taken by the retry is no call.
        if probe:
            self._observer.probed(usable=usable)
        with self._lock:
            self._answers += 1


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
