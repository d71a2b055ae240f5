"""The seams between the logic and the storage adapters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Texts to L2-normalised vectors; deterministic for a given model file."""

    model_name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[Vector]: ...
