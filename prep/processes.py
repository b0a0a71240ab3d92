"""Run one function over many tasks in worker processes, results in task order, memory bounded.

    for result in ordered_map(index_one_shard, tasks, workers=8, what="indexing shards"):
        ...   # results come in the order of `tasks`, whatever order the workers finish in

Both `prepare` (one task per shard scanned) and `write` (one task per JSONL shard written) use it. At most
`workers + 1` tasks are in flight, so results waiting to be taken stay few. Workers leave Ctrl-C and
SIGTERM to the main process, which stops them: whenever the caller stops taking results (done, an
error, an interrupt), every worker is terminated before `ordered_map` returns, so none is still writing
when the caller cleans up. A worker that dies (killed, out of memory) ends the run with a PrepError
instead of a hang.

No worker outlives the process that started it, whatever kills that process (SIGKILL from the OOM
killer or a scheduler included): on Linux each worker asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG, set in the worker before it does anything else), checks its parent before each task,
and holds no pipe end but its own (a forked worker inherits the main process's ends of every pipe made so
far and closes them; holding the reading end of its own result pipe is what once kept orphaned workers
blocked forever in a write nobody would read). Each worker talks to the main process over its own duplex
pipe, so a dead one is known by which task it held. The parent-death signal follows the thread that
started the workers: call `ordered_map` from a thread that lives as long as the run (the main thread).
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

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


FORK = sys.platform.startswith("linux")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker, as text: the `__cause__` of the re-raised error."""


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if that has happened already."""
    if FORK:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _serve(connection: Connection, foreign_ends: list[Connection], parent: int, preload: str | None) -> None:
    """A worker's life: run `(function, args)` tasks from `connection`, sending back `(True, result)` or
    `(False, exception, traceback text)`, until the connection closes or the parent is gone."""
    _die_with_parent(parent)
    for end in foreign_ends:
        end.close()
    # Ctrl-C and SIGTERM are the main process's to handle: it stops the workers and cleans up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy, if loaded, without BLAS threads it never uses
    if preload is not None:
        importlib.import_module(preload)
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            return
        if os.getppid() != parent:
            return
        function, args = task
        try:
            reply: tuple = (True, function(*args))
        except BaseException as error:
            reply = (False, _portable(error), traceback.format_exc())
        try:
            connection.send(reply)
        except OSError:
            return
        except Exception as error:  # a result or exception that does not pickle
            failure = RuntimeError(
                f"{getattr(function, '__name__', function)} returned what cannot be sent: {error}"
            )
            connection.send((False, failure, traceback.format_exc()))


def _portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class _Pool:
    """`workers` forked processes, each on its own duplex pipe; terminated when the `with` block ends."""

    def __init__(self, workers: int, preload: str | None, what: str) -> None:
        self.what = what
        context = multiprocessing.get_context("fork" if FORK else "spawn")
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self.connections: list[Connection] = []
        try:
            for _ in range(workers):
                mine, theirs = context.Pipe()
                self.connections.append(mine)
                foreign = list(self.connections) if FORK else []
                process = context.Process(
                    target=_serve, args=(theirs, foreign, os.getpid(), preload), daemon=True
                )
                process.start()
                theirs.close()
                self.processes.append(process)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join()
        for connection in self.connections:
            connection.close()

    def died(self) -> PrepError:
        return PrepError(
            f"A process {self.what} died unexpectedly (killed, or out of memory?). Nothing was written;"
            " run again, with fewer --num-workers if memory is short."
        )

    def map(self, function: Callable[..., Result], tasks: Sequence[tuple]) -> Iterator[Result]:
        """`function(*task)` for every task, yielded in task order, at most `workers + 1` in flight."""
        idle = list(range(len(self.processes)))
        held: dict[int, int] = {}  # worker -> the task it runs
        done: dict[int, tuple] = {}  # task -> its reply, until its turn comes
        sent = taken = 0
        while taken < len(tasks):
            while idle and sent < len(tasks) and sent - taken <= len(self.processes):
                worker = idle.pop()
                try:
                    self.connections[worker].send((function, tasks[sent]))
                except OSError:
                    raise self.died() from None
                held[worker] = sent
                sent += 1
            if taken in done:
                yield _unpack(done.pop(taken))
                taken += 1
                continue
            self._collect(held, done, idle)

    def _collect(self, held: dict[int, int], done: dict[int, tuple], idle: list[int]) -> None:
        """Wait for at least one busy worker to reply (or die, which is an error)."""
        watched: dict[Any, int] = {}
        for worker in held:
            watched[self.connections[worker]] = worker
            watched[self.processes[worker].sentinel] = worker
        for ready in wait(list(watched)):
            worker = watched[ready]
            if worker not in held:
                continue  # its reply was taken through the other handle
            connection = self.connections[worker]
            if not connection.poll():
                raise self.died()
            try:
                done[held.pop(worker)] = connection.recv()
            except (EOFError, OSError):
                raise self.died() from None
            idle.append(worker)


def _unpack(reply: tuple) -> Any:
    if reply[0]:
        return reply[1]
    error = reply[1]
    raise error from WorkerTraceback(reply[2])


def in_child(function: Callable[..., Result], *args: object, what: str) -> Result:
    """`function(*args)` run in a forked child process that exits afterwards: for work that loads a big
    module (numpy) the main process should not hold when it later forks its workers, since every worker
    would then carry it too. `what` names the work in the error if the child dies."""
    with _Pool(1, None, what) as pool:
        return next(pool.map(function, [args]))


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
    `preload` is a module each worker imports as it starts. The workers end before the last result is
    given: a caller that takes every result leaves none running, whether or not it asks for more."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield function(*task)
        return
    with _Pool(workers, preload, what) as pool:
        results = pool.map(function, tasks)
        for _ in range(len(tasks) - 1):
            yield next(results)
        last = next(results)
    yield last
