"""energon's loader state, saved and restored: what the cookers' task encoders must survive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def batches_around_a_restore(fresh: Callable[[], Any], taken: int = 3) -> tuple[list, list]:
    """The batches a fresh savable loader gives after its first `taken`, and the batches a second fresh
    loader gives once the first one's state, saved after those `taken`, is restored into it.

    Both are read to the end, so each loader's workers finish on their own instead of being waited for.
    """
    loader = fresh()
    iterator = iter(loader)
    for _ in range(taken):
        next(iterator)
    state = loader.save_state_rank()
    expected = list(iterator)
    restored = fresh()
    restored.restore_state_rank(state)
    return expected, list(restored)
