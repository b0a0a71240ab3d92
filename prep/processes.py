"""Run one function over many tasks in worker processes, results in task order, memory bounded.

    for result in ordered_map(index_one_shard, tasks, workers=8, what="indexing shards"):
        ...   # results come in the order of `tasks`, whatever order the workers finish in

Both `prepare` (one task per shard scanned) and `write` (one task per JSONL shard written) use it. At most
`workers + 1` tasks are in flight, so results waiting to be taken stay few. Workers leave Ctrl-C and
SIGTERM to the main process, which stops them: whenever the caller stops taking results (done, an
error, an interrupt), every worker is terminated before `ordered_map` returns, so none is still writing
when the caller cleans up. A worker that dies (killed, out of memory) ends the run with a PrepError
instead of a hang.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import TypeVar

from prep.errors import PrepError

Result = TypeVar("Result")


def available_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def worker_count(requested: int | None, tasks: int) -> int:
    """How many workers to start: `requested` (default: one per CPU), at most one per task.

    >>> worker_count(8, 3), worker_count(2, 0)
    (3, 1)
    """
    if requested is not None and requested < 1:
        raise PrepError("--num-workers must be at least 1.")
    return max(1, min(requested or available_cores(), tasks))


def _worker_start(preload: str | None) -> None:
    """Workers leave Ctrl-C and SIGTERM to the main process, which stops them and cleans up. Each loads
    `preload` (and numpy, without BLAS threads it never uses) as it starts, while the main process goes on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if preload is not None:
        importlib.import_module(preload)


def in_child(function: Callable[..., Result], *args: object, what: str) -> Result:
    """`function(*args)` run in a forked child process that exits afterwards: for work that loads a big
    module (numpy) the main process should not hold when it later forks its workers, since every worker
    would then carry it too. `what` names the work in the error if the child dies."""
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=_worker_start, initargs=(None,)) as executor:
        try:
            return executor.submit(function, *args).result()
        except BrokenProcessPool:
            raise PrepError(f"A process {what} died unexpectedly (killed, or out of memory?).") from None


def ordered_map(
    function: Callable[..., Result],
    tasks: Sequence[tuple],
    workers: int,
    *,
    what: str,
    preload: str | None = None,
) -> Iterator[Result]:
    """`function(*task)` for every task, in task order, on up to `workers` processes (in this process
    when `workers` is 1 or there is one task). `what` names the work in the error if a worker dies;
    `preload` is a module each worker imports as it starts."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield function(*task)
        return
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    executor = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_start, initargs=(preload,)
    )
    try:
        pending: deque = deque()
        upcoming = iter(tasks)
        for task in islice(upcoming, workers + 1):
            pending.append(executor.submit(function, *task))
        while pending:
            try:
                result = pending.popleft().result()
            except BrokenProcessPool:
                raise PrepError(
                    f"A process {what} died unexpectedly (killed, or out of memory?). Nothing was written;"
                    " run again, with fewer --num-workers if memory is short."
                ) from None
            for task in islice(upcoming, 1):
                pending.append(executor.submit(function, *task))
            yield result
    finally:
        for process in list(getattr(executor, "_processes", {}).values()):
            process.terminate()
        executor.shutdown(wait=True, cancel_futures=True)
