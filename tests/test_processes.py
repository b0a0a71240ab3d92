"""Worker processes for prepare and write: results in task order, and a dead worker is an error, not a hang."""

from __future__ import annotations

import os
import signal

import pytest

from prep.errors import PrepError
from prep.processes import ordered_map, worker_count


def square_slowly_in_reverse(number: int, count: int) -> tuple[int, int]:
    import time

    time.sleep(0.01 * (count - number))  # the first tasks finish last
    return number, number * number


def die_on_three(number: int) -> int:
    if number == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return number


def test_results_come_in_task_order_whatever_order_workers_finish_in() -> None:
    tasks = [(number, 12) for number in range(12)]
    results = list(ordered_map(square_slowly_in_reverse, tasks, 3, what="squaring"))
    assert results == [(number, number * number) for number in range(12)]
    assert list(ordered_map(square_slowly_in_reverse, tasks[:2], 1, what="squaring")) == results[:2]


def test_a_worker_killed_mid_run_ends_it_with_an_error_naming_the_work() -> None:
    with pytest.raises(PrepError, match="A process writing shards died unexpectedly"):
        list(ordered_map(die_on_three, [(number,) for number in range(8)], 2, what="writing shards"))


def test_worker_count_is_one_per_task_at_most_and_refuses_zero() -> None:
    assert worker_count(8, 3) == 3 and worker_count(None, 1) == 1
    with pytest.raises(PrepError, match="--num-workers must be at least 1"):
        worker_count(0, 5)
