"""The vectors of one memory's entry, shared by its versions: a version's new vectors are
appended, and a row an entry reads is never written again.

A memory's entry keeps its rows in fact-id order, so a new fact goes in the middle. With the
vectors in that order too, every version copied the whole matrix: 15 MB for a user of 10,000
facts, 30 ms a version as measured, most of it the kernel faulting in a fresh allocation
(BENCHMARKS.md, "The entry's update in place"). Here an entry maps each of its rows to a row
of a buffer (its slots); the next version writes its new and rewritten vectors into rows of
the buffer nobody has claimed and copies only the slots. When the buffer is full the next
version copies the live rows into a larger one: rarely, and never a row an older version is
still reading, since that one keeps its buffer.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from domain.ports import Vector

__all__ = ["AppendOnlyMatrix"]

# Room a buffer leaves for later versions' rows, as a share of the rows it starts with.
_SPARE_SHARE = 0.25
_MIN_SPARE_ROWS = 8
# A buffer built for this many rows or more gets its room at once.
_ROOM_FROM_ROWS = 1_024


class AppendOnlyMatrix:
    """A buffer of rows; `claim` hands out rows not handed out before (thread-safe)."""

    def __init__(self, rows: npt.NDArray[np.float32], used: int | None = None) -> None:
        self.rows = rows
        self._used = rows.shape[0] if used is None else used
        self._lock = threading.Lock()

    @classmethod
    def with_room(cls, rows: int, dimension: int) -> AppendOnlyMatrix:
        """A zero buffer for `rows` rows, used, and for a large one room for later versions'
        rows: its first update then copies nothing (at 10,000 rows that copy made the
        update's worst call, 101 ms). A small buffer grows at its first update instead, for
        next to nothing."""
        room = _spare(rows) if rows >= _ROOM_FROM_ROWS else 0
        return cls(np.zeros((rows + room, dimension), dtype=np.float32), used=rows)

    @property
    def nbytes(self) -> int:
        """The whole buffer's, the room too (counted as if resident)."""
        return int(self.rows.nbytes)

    def claim(self, count: int) -> int | None:
        """The first of `count` consecutive rows now the caller's alone to write, or None
        when the buffer has not that many left."""
        with self._lock:
            if self._used + count > self.rows.shape[0]:
                return None
            start = self._used
            self._used += count
            return start

    def appended(
        self,
        slots: npt.NDArray[np.int64],
        live: npt.NDArray[np.bool_],
        extent: int,
        writes: Sequence[tuple[int, Vector]],
    ) -> tuple[AppendOnlyMatrix, npt.NDArray[np.int64], int]:
        """Write `writes` (entry row, vector) for an entry whose rows are at `slots` (`live`:
        the rows whose slot holds their vector) and which reads this buffer up to `extent`:
        returns the buffer, the new slots and the new extent. `slots` is changed in place."""
        start = self.claim(len(writes))
        if start is None:
            return self._grown(slots, live, writes)
        for k, (row, vector) in enumerate(writes):
            self.rows[start + k] = vector
            slots[row] = start + k
        return self, slots, max(extent, start + len(writes))

    def _grown(
        self,
        slots: npt.NDArray[np.int64],
        live: npt.NDArray[np.bool_],
        writes: Sequence[tuple[int, Vector]],
    ) -> tuple[AppendOnlyMatrix, npt.NDArray[np.int64], int]:
        kept = np.flatnonzero(live)
        used = kept.size + len(writes)
        rows = np.zeros((used + _spare(used), self.rows.shape[1]), dtype=np.float32)
        np.take(self.rows, slots[kept], axis=0, out=rows[: kept.size])
        slots[kept] = np.arange(kept.size)
        for k, (row, vector) in enumerate(writes):
            rows[kept.size + k] = vector
            slots[row] = kept.size + k
        return AppendOnlyMatrix(rows, used), slots, used


def _spare(used: int) -> int:
    return max(_MIN_SPARE_ROWS, int(used * _SPARE_SHARE))
