"""The arithmetic of a progress line: how long a run has to go, at its pace so far.

Pieces an earlier run finished (`--resume`) count as done but took no time, so they are left out of the
pace and out of what is left:

>>> time_left(elapsed=5.0, done=10, total=40)
15.0
>>> time_left(elapsed=5.0, done=10, total=40, reused=(8, 8))  # 2 pieces in 5 s; 30 left, none reused
75.0
>>> time_left(elapsed=0.1, done=8, total=40, reused=(8, 20)) is None  # nothing done here yet: no pace
True
"""

from __future__ import annotations


def time_left(elapsed: float, done: int, total: int, reused: tuple[int, int] = (0, 0)) -> float | None:
    """Seconds until `total` pieces are done, `done` of them after `elapsed` seconds; `reused` is (pieces
    reused so far, pieces to reuse in all). None while no piece has been worked on here, or none is left."""
    reused_done, reused_all = reused
    worked, left = done - reused_done, total - done - (reused_all - reused_done)
    if worked <= 0 or left <= 0:
        return None
    return elapsed / worked * left
