"""Ray as an engine: one ordered, bounded map over the tasks of a Ray cluster (`--engine ray`).

    with RayEngine(address=None, workers=2) as engine:   # a local Ray instance, stopped at the end
        for result in engine.ordered_map(index_one_shard, tasks, what="indexing shards"):
            ...   # in the order of `tasks`, as `prep.processes.ordered_map` gives them

Tasks go to Ray in chunks of a few (`chunk_size`: one Ray task per shard costs more than scanning a small
shard), and at most `CHUNKS_PER_CPU` chunks per CPU are submitted and not yet taken, so the driver holds a
bounded number of results however many tasks there are. A chunk whose worker or node dies (or whose
result is lost, or whose wait times out: `retry_notice`) is submitted again, up to `RETRIES` times,
after a pause that doubles each time (`retry_delay`, so a node that is restarting has time to come
back); each retry is announced naming the chunk's tasks (`notify`, stderr by default), and after the
last the run stops with a PrepError naming them. Any other failure in Ray would come again (a runtime
environment Ray cannot set up, a task a worker cannot load): the run stops at once with a PrepError
naming the chunk's tasks and what to do. An exception the function raises comes back as itself, as
from `prep.processes.ordered_map`; what it raises that is not an Exception (a BaseException) stops the
run with a PrepError saying so, not retried. Leaving the `with` block
(done, an error, Ctrl-C) cancels the chunks in flight and waits for them, so none is still writing when
the caller cleans up.

Ray is an optional extra and slow to import: only this module imports it, and only `--engine ray` imports
this module. Ray is started, or its cluster reached, by the first map given tasks, not before: a
`--resume` run whose every task an earlier run did has nothing to send and starts none. Without
`address` a local Ray instance is started with `workers` CPUs and shut down when the `with` block ends;
with one, the driver connects to that cluster and leaves it running, and a cluster that asks for a token
this run does not send, or not its own, is named first (`check_token`), with where the token goes. A Ray
already initialised in this process (a Ray program calling the Python API) is used as it is and left
running.
No process of a local instance outlives the run, whatever ends it: Ray stops its own when the driver
dies, except its agents, so a small forked watcher (`_Watcher`) holds the list of the instance's
processes and kills what is left of them once the driver is gone, SIGKILL included. Workers on other
machines need shardprep installed and the dataset at the same path.

Each task asks for `TASK_CPUS` CPUs. Ray keeps a task that no node can give them waiting, without a word,
until a node that can joins (a cluster whose only node was started with `ray start --head --num-cpus 0`:
an autoscaler starts such a node, and without one the tasks wait for ever), so before its first task a
run checks that some live node offers them (`unrunnable`) and says at once if none does; and when every
node that did leaves mid-run, it says so once the wait for a result has lasted `cpu_wait` seconds
(`CpuWatch`), checking the cluster at a quarter of that interval only while it waits.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import logging
import os
import pickle
import secrets
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from prep.errors import PrepError

Result = TypeVar("Result")

#: The extra that installs Ray, named in the error when Ray is missing.
RAY_EXTRA = "shardprep[ray]"
#: How often a chunk whose worker died (a node lost, a worker killed) is run again before the run fails.
RETRIES = 3
#: Seconds before the first retry of a chunk; each further retry of it waits twice as long.
RETRY_DELAY = 1.0
#: Chunks in flight per CPU of the cluster: enough to keep every worker busy while results are taken.
CHUNKS_PER_CPU = 2
#: At most this many tasks per chunk, so results come back steadily and a retry repeats little work.
MAX_CHUNK = 16
#: Seconds to wait for a cancelled chunk to end when a run stops early.
STOP_TIMEOUT = 30.0
#: Seconds the chunks in flight have to end by themselves when a run stops early, before they are killed.
STOP_GRACE = 5.0
#: Seconds a cluster's address has to answer a TCP connection before the run gives up on it, and Ray's
#: client (`check_token`) before the token check steps aside.
CONNECT_TIMEOUT = 5.0
#: The CPUs each Ray task asks of the node that runs it (Ray's own default for a task, said here once).
TASK_CPUS = 1
#: The environment variable that has a driver send its token to a cluster that asks for one ("token"), as
#: Ray does by itself only for a cluster it finds (`auto`), never for an address given: that would hand
#: the token to whatever answers there.
AUTH_MODE = "RAY_AUTH_MODE"
#: The environment variables with which a user chooses Ray's token authentication and where its token is.
AUTH_CHOICES = (AUTH_MODE, "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
#: Seconds a run waits for a result, no live node able to run a task, before it says so (mid-run: every
#: node with CPUs has left).
CPU_WAIT = 20.0
#: Bytes enough for any platform's struct sigaction (glibc's is 152 on x86-64).
SIGACTION_BYTES = 512
#: Seconds between two looks at the kernel's action for SIGTERM while Ray starts or stops (`sigterm_kept`).
KEPT_EVERY = 0.005


def _missing() -> PrepError:
    return PrepError(f"--engine ray needs Ray, which is not installed: pip install {RAY_EXTRA}")


def check_ray_installed() -> None:
    """A one-line PrepError naming the extra unless Ray can be imported; cheap (Ray is found, not loaded),
    so a run can refuse before any work."""
    try:
        found = sys.modules["ray"] if "ray" in sys.modules else importlib.util.find_spec("ray")
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise _missing()


def import_ray() -> ModuleType:
    """The `ray` module, or a one-line PrepError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise _missing() from None
    return ray


def chunk_size(tasks: int, cpus: int) -> int:
    """Tasks per Ray task: about four chunks per CPU, at most MAX_CHUNK tasks each.

    >>> chunk_size(100, 2), chunk_size(10_000, 2), chunk_size(0, 4)
    (12, 16, 1)
    """
    return max(1, min(MAX_CHUNK, tasks // (4 * max(1, cpus))))


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), to tell it from a later one with its pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of process `root`, with its start time."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found: dict[int, str] = {}
    waiting = list(children.get(root, []))
    while waiting:
        pid = waiting.pop()
        start = _process_start(pid)
        if start is not None:
            found[pid] = start
        waiting += children.get(pid, [])
    return found


def _new_descendants(root: int, before: dict[int, str]) -> dict[int, str]:
    """The descendants of process `root` (pid -> start time) that are not among `before` (those it had
    before Ray started: a program's own children, which are not Ray's to end)."""
    return {pid: start for pid, start in _descendants(root).items() if before.get(pid) != start}


def _frozen_descendants(root: int, before: dict[int, str]) -> dict[int, str]:
    """Every descendant of process `root` not among `before` (`_new_descendants`), with its start time,
    each stopped (SIGSTOP) so that it starts no other: looked for again until a look finds none new. For
    `_kill_left`, which SIGKILL ends them with."""
    found: dict[int, str] = {}
    while new := {
        pid: start for pid, start in _new_descendants(root, before).items() if found.get(pid) != start
    }:
        for pid, start in new.items():
            if _process_start(pid) == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
        found.update(new)
    return found


def _kill_left(processes: dict[int, str]) -> None:
    """SIGKILL each of `processes` (pid -> start time) still alive; a pid since reused is left alone."""
    for pid, start in processes.items():
        if _process_start(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class _Watcher:
    """A forked process that outlives nothing: it waits for the driver to end (its pipe closes, however
    the driver ends) and then kills `processes` (pid -> start time) still alive, then exits."""

    def __init__(self, processes: dict[int, str]) -> None:
        reading, self._writing = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the watcher: only system calls from here on (the driver has threads)
            try:
                os.close(self._writing)
                os.read(reading, 1)  # returns when every copy of the writing end is closed
                _kill_left(processes)
            finally:
                os._exit(0)
        os.close(reading)

    def close(self) -> None:
        """The run ended normally: let the watcher clean up what Ray left, and wait for it."""
        os.close(self._writing)
        os.waitpid(self.pid, 0)


@contextlib.contextmanager
def sigterm_kept(defer: bool = False) -> Iterator[None]:
    """SIGTERM handled by this process's own handler (a command's: unwind like Ctrl-C, so what was staged
    is removed) while the block starts or stops Ray, and after it.

    ray.init puts in handlers of its own (a SystemExit at once: the run ended with exit code 15 and no
    word), so Ray is kept from setting any while the block runs (`_without_ray_handlers`); ray.shutdown
    resets SIGTERM in the kernel to its default (kill at once) early, through Ray's core worker, and
    then takes about a second to stop the instance's processes, so the kernel's action is put back
    whenever it is reset while the block runs (`_kernel_action_kept`). A handler that raises while Ray
    forks its servers raises into a fork hook, where Python prints the exception and drops it: a SIGTERM
    the block received whose exception did not end the block is handled again after it. With `defer`
    (around ray.shutdown), a SIGTERM is only noted while the block runs, and handled after it: raised in
    the middle of ray.shutdown, it would leave the instance's workers running. Where SIGTERM has no
    handler of Python's (its default, or ignored), Ray's handle it while the block runs, as they clean up
    what was half started; outside the main thread the block runs as it is."""
    handler = signal.getsignal(signal.SIGTERM)
    if handler is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        received.append(signum)
        if not defer:
            handler(signum, frame)

    with contextlib.ExitStack() as kept:
        if callable(handler):
            kept.enter_context(_without_ray_handlers())
            signal.signal(signal.SIGTERM, on_sigterm)
            kept.enter_context(_kernel_action_kept(signal.SIGTERM))
        kept.callback(signal.signal, signal.SIGTERM, handler)
        yield
    if received:
        handler(signal.SIGTERM, None)


@contextlib.contextmanager
def _kernel_action_kept(signum: int) -> Iterator[None]:
    """The kernel's action for `signum` as it is when the block begins, put back within KEPT_EVERY seconds
    by a thread of this process whenever something resets it while the block runs (Python's table of
    handlers does not see a reset made in C: only the kernel's copy tells). Linux only (a struct
    sigaction begins with its handler there); elsewhere the block runs as it is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ours = ctypes.create_string_buffer(SIGACTION_BYTES)  # a struct sigaction, whatever its layout
        found = sys.platform.startswith("linux") and libc.sigaction(signum, None, ours) == 0
    except (OSError, AttributeError):
        found = False
    if not found:
        yield
        return
    now = ctypes.create_string_buffer(SIGACTION_BYTES)
    handler_bytes = ctypes.sizeof(ctypes.c_void_p)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(KEPT_EVERY):
            if libc.sigaction(signum, None, now) == 0 and now.raw[:handler_bytes] != ours.raw[:handler_bytes]:
                libc.sigaction(signum, ours, None)

    keeper = threading.Thread(target=keep, name="shardprep-sigterm", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()


@contextlib.contextmanager
def _without_ray_handlers() -> Iterator[None]:
    """Ray sets no SIGTERM handler while the block runs (not a public API of Ray: if it has changed, Ray's
    handlers are set as before, until `sigterm_kept` puts the process's own back)."""
    try:
        from ray._private import utils as ray_utils

        sets = ray_utils.set_sigterm_handler
    except (ImportError, AttributeError):
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = sets


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A PrepError unless a Ray cluster's `host:port` (or `ray://host:port`) answers a TCP connection
    within `timeout` seconds: ray.init would otherwise wait on it for minutes. "auto" and "local" are
    Ray's own to resolve.

    >>> check_reachable("auto")
    >>> check_reachable("127.0.0.1:1", timeout=1)
    Traceback (most recent call last):
    prep.errors.PrepError: Could not reach the Ray cluster at 127.0.0.1:1 (Connection refused). Check --ray-address: the head node's address and GCS port (6379 unless `ray start --port` said otherwise), or `auto` on a node of the cluster.
    """
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise PrepError(f"--ray-address {address!r} is not HOST:PORT (or ray://HOST:PORT, or auto).")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        raise PrepError(
            f"Could not reach the Ray cluster at {address} ({error.strerror or error}). Check --ray-address:"
            " the head node's address and GCS port (6379 unless `ray start --port` said otherwise), or"
            " `auto` on a node of the cluster."
        ) from None


def check_token(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A PrepError saying what to do if the Ray cluster at `address` (HOST:PORT) asks for a token that this
    process will not send, or sends wrong: ray.init would try for 20 s, warning each second, and then say
    only that it could not connect. One request, through Ray's own client (not a public API of Ray: if it
    has changed, ray.init is left to find out); any other failure is ray.init's to report, too. An address
    that takes connections but has not answered as a Ray cluster within `timeout` seconds (another
    service's port) is a PrepError: ray.init would wait on it for ever, deaf to SIGTERM (Ray's client has no
    timeout of its own below 40 s: it is left to end in a thread of its own).

    >>> check_token("auto")
    """
    if address in ("auto", "local") or address.startswith("ray://"):  # Ray finds the cluster, or a client
        return
    from ray.exceptions import AuthenticationError

    sends = os.environ.get(AUTH_MODE, "").lower() == "token"
    try:
        from ray._raylet import AuthenticationTokenLoader, GcsClient

        if sends and not AuthenticationTokenLoader.instance().has_token():
            return  # ray.init says so at once, where Ray's client would abort the process
    except Exception:  # noqa: BLE001 - Ray's internals have changed: ray.init reports what is wrong
        return
    refused: list[AuthenticationError] = []

    def ask() -> None:
        try:
            GcsClient(address=address)
        except AuthenticationError as error:
            refused.append(error)
        except Exception:  # noqa: BLE001 - not about the token: ray.init tries again, and reports it
            pass

    asking = threading.Thread(target=ask, name="shardprep token check", daemon=True)
    asking.start()
    asking.join(timeout)
    if asking.is_alive():
        raise PrepError(
            f"Nothing at {address} answered as a Ray cluster within {timeout:g} s, though it takes"
            " connections: give the address of the head node's GCS (`ray start --head` prints it; port 6379"
            " unless changed), or, if that is what it is, check that the head is not too busy to answer."
        )
    if refused:
        why = "the token this run sends is not its" if sends else _NOT_SENT
        raise _token_refused(address, why) from None


#: Why a driver that is not in token mode sends no token.
_NOT_SENT = f"this run sends none: Ray sends one to an address given only with {AUTH_MODE}=token"


def _token_refused(address: str, why: str) -> PrepError:
    """The run's error for a cluster that asks for a token and does not get its own, `why`."""
    return PrepError(
        f"The Ray cluster at {address} asks for a token, and {why}. Run with {AUTH_MODE}=token and the"
        " cluster's token (`ray get-auth-token` on its head node prints it) in the environment variable"
        " RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token."
    )


@functools.cache
def _own_token() -> str:
    """This process's token for the local instances it starts: one for all of them, since Ray's loader
    keeps the first token it read for the life of the process (a second instance with a new token would
    refuse the driver: InvalidAuthToken)."""
    return secrets.token_hex(32)


@contextlib.contextmanager
def token_of_its_own() -> Iterator[None]:
    """A token for a local instance, only in this process's environment (RAY_AUTH_TOKEN, which its
    processes inherit) while the block runs, unless the user chose Ray's token authentication (an
    `AUTH_CHOICES` variable set): Ray 2.60 turns it on for a local instance and, finding no token, writes
    one to ~/.ray/auth_token, which the user's next `ray start --head` then finds and turns it on with."""
    if any(name in os.environ for name in AUTH_CHOICES):
        yield
        return
    os.environ["RAY_AUTH_TOKEN"] = _own_token()
    try:
        yield
    finally:
        for name in AUTH_CHOICES:  # ray.init sets RAY_AUTH_MODE=token beside it
            os.environ.pop(name, None)


def unrunnable(node_cpus: list[float], needed: float = TASK_CPUS) -> str | None:
    """Why no node can run a task that asks for `needed` CPUs, given the CPUs each live node of the
    cluster offers to tasks; None if one can.

    >>> unrunnable([0.0]), unrunnable([]), unrunnable([0.5, 0.5]), unrunnable([0.0, 4.0])
    ('its one node offers no CPU to tasks', 'it has no live node', 'its 2 nodes offer 1 CPU in all, at most 0.5 on one', None)
    """
    if any(cpus >= needed for cpus in node_cpus):
        return None
    if not node_cpus:
        return "it has no live node"
    nodes = "its one node offers" if len(node_cpus) == 1 else f"its {len(node_cpus)} nodes offer"
    if not any(node_cpus):
        return f"{nodes} no CPU to tasks"
    return f"{nodes} {sum(node_cpus):g} CPU in all, at most {max(node_cpus):g} on one"


class CpuWatch:
    """When to say that no live node can run a task: once for each stretch without one, when it has lasted
    `after` seconds. A stretch ends when a node can run one again, or a task has run.

    >>> watch, no_node = CpuWatch(), "it has no live node"
    >>> [watch.due(no_node, now, after=10) for now in (0, 5, 10, 15, 30)]
    [False, False, True, False, False]
    >>> watch.due(None, 31, after=10), watch.due(no_node, 32, after=10), watch.due(no_node, 42, after=10)
    (False, False, True)
    >>> watch.ended(); watch.due(no_node, 43, after=0)
    True
    """

    def __init__(self) -> None:
        self._since: float | None = None
        self._said = False

    def due(self, why: str | None, now: float, after: float) -> bool:
        """Whether to say `why` (what `unrunnable` gives: None if a node can run a task) at `now` seconds."""
        if why is None:
            self.ended()
            return False
        if self._since is None:
            self._since = now
        if self._said or now - self._since < after:
            return False
        self._said = True
        return True

    def ended(self) -> None:
        """The stretch without a node that can run a task is over."""
        self._since, self._said = None, False


@functools.cache
def shardprep_code() -> str:
    """A digest of the source of the `prep` package this process runs, to tell a node of a cluster that
    runs other code than the driver (another version, another checkout)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _other_shardprep(error: BaseException, node: str = "A node of the Ray cluster") -> PrepError:
    """The error for a task that failed on a node running other shardprep code than the driver."""
    return PrepError(
        f"{node} runs another shardprep than this machine ({Path(__file__).resolve().parents[1]}), and this"
        f" run's task failed there with {type(error).__name__}: {_first_line(error)}. Install the shardprep"
        " this machine runs on every node of the cluster, then run again."
    )


def _run_chunk(
    function: Callable[..., Any], chunk: list[tuple], code: str
) -> tuple[list[Any], BaseException | str | None]:
    """A Ray task: `function(*task)` for each task of the chunk, in order. A task that raises after others
    ran ends the chunk there: its exception comes back beside their results, for the driver to raise
    after giving them, as from `prep.processes.ordered_map`; the first task's exception is raised, as is
    any exception that cannot cross to the driver as a value (then the chunk's results are lost with it,
    and the driver runs the chunk again from its first task not given). A SystemExit (sys.exit) always
    comes back beside the results: raised, Ray would end the worker with it, a worker that died to the
    driver, which would retry the chunk. Where this node's shardprep is not the driver's (`code`, its
    `shardprep_code`), a task's exception is raised as a PrepError that says so."""
    results = []
    for task in chunk:
        try:
            results.append(function(*task))
        except SystemExit as exited:
            return results, exited if _portable(exited) else SystemExit(repr(exited.code))
        except Exception as error:
            if code != shardprep_code():
                raise _other_shardprep(error, f"The node {socket.gethostname()}") from None
            if not results:
                raise
            if not _portable(error):  # Ray would fail to return it: the driver reruns the rest
                return results, _RERUN
            return results, error
    return results, None


def _portable(error: BaseException) -> bool:
    """Whether `error` can cross from a worker to the driver as a value (it survives pickling)."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever pickling raises, it does not cross
        return False
    return True


#: What a chunk gives instead of an exception it cannot return: its remaining tasks are to be run again.
_RERUN = "rerun"

#: How Ray's placeholder for a remote function a worker failed to import starts its error.
_NOT_IMPORTED = "The remote function failed to import on the worker"


def retry_notice(error: BaseException) -> str | None:
    """How a retry names `error`, a chunk's failure in Ray, if running the chunk again may get past it
    (its worker or node died, its result was lost, a wait timed out); None for any other, which would
    fail again (Ray cannot set up the task's runtime environment, a worker cannot load it, ...)."""
    from ray import exceptions as ray_failed

    retried = (
        (ray_failed.WorkerCrashedError, "a Ray worker died"),
        (ray_failed.OutOfMemoryError, "a Ray worker was killed for memory"),
        (ray_failed.NodeDiedError, "a Ray node died"),
        (ray_failed.LocalRayletDiedError, "a Ray node died"),
        (ray_failed.ObjectLostError, "a Ray task's result was lost"),
        (ray_failed.GetTimeoutError, "a Ray task timed out"),
    )
    return next((notice for kind, notice in retried if isinstance(error, kind)), None)


def _not_loaded(error: BaseException) -> str | None:
    """Why a worker could not load the chunk's task (an argument or the function it could not unpickle,
    its module not installed there), if that is what `error`, a RayTaskError, says; else None."""
    from ray import exceptions as ray_failed

    cause = getattr(error, "cause", None)
    if isinstance(cause, ray_failed.RaySystemError) or str(cause).startswith(_NOT_IMPORTED):
        return _last_line(cause)  # the import's own error, ending Ray's traceback
    return None


class RayEngine:
    """A connection to a Ray cluster (started here unless `address` names one) for one run."""

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        retry_delay: float = RETRY_DELAY,
        cpu_wait: float = CPU_WAIT,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        self.address = address
        self.workers = workers
        self.retry_delay = retry_delay
        self.cpu_wait = cpu_wait
        #: Told of each retry as it happens (one line of text); stderr unless given.
        self.notify = notify or _to_stderr
        self.ray = import_ray()
        self._entered = self._started = False
        self._watcher: _Watcher | None = None
        self._remote: Any = None
        self._maps: list[Generator[Any, None, None]] = []
        self._cpus = CpuWatch()
        self._local = contextlib.ExitStack()  # what a local instance started here needs while it runs

    def __enter__(self) -> RayEngine:
        self._entered = True
        return self

    def _start(self) -> None:
        """Start a local Ray instance, or connect to the cluster, unless this process has Ray already."""
        ray = self.ray
        if not ray.is_initialized():
            if self.address is not None:
                check_reachable(self.address)
                check_token(self.address)
            else:
                self._local.enter_context(token_of_its_own())
            linux = sys.platform.startswith("linux")
            before = _descendants(os.getpid()) if linux else {}
            try:
                with sigterm_kept():
                    ray.init(
                        # "local": a new instance for the run, even where a cluster runs (use it with "auto")
                        address=self.address or "local",
                        num_cpus=self.workers if self.address is None else None,
                        include_dashboard=False,
                        logging_level=logging.WARNING,
                        log_to_driver=False,
                    )
            except ray.exceptions.AuthenticationError:  # connecting only: a local instance makes its token
                raise _token_refused(str(self.address), f"{AUTH_MODE}=token, but none was found") from None
            except (ConnectionError, RuntimeError, ValueError) as error:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise PrepError(f"Could not start or reach {where}: {error}") from None
            except BaseException:  # Ctrl-C or SIGTERM while Ray starts: stop what it has started so far
                self._stop_half_started(before)
                raise
            self._started = True
            if self.address is None and linux:
                self._watcher = _Watcher(_new_descendants(os.getpid(), before))
        self._check_runnable(after=0)
        # retried here, not by Ray
        self._remote = ray.remote(num_cpus=TASK_CPUS, max_retries=0, retry_exceptions=False)(_run_chunk)

    def _check_runnable(self, after: float) -> None:
        """Say (`notify`) when no live node has been able to run a task for `after` seconds, once for each
        such stretch (`CpuWatch`): Ray keeps the tasks waiting, without a word, until one joins, which an
        autoscaling cluster makes happen and any other never does."""
        node_cpus = self._node_cpus()
        if node_cpus is None:  # only a note: a cluster that cannot answer is for ray.get to report
            return
        why = unrunnable(node_cpus)
        if not self._cpus.due(why, time.monotonic(), after):
            return
        where = f"the Ray cluster at {self.address}" if self.address is not None else "this process's Ray"
        self.notify(
            f"Note: no node of {where} can run a task of this run now: each asks for {TASK_CPUS} CPU, and"
            f" {why}. The tasks wait until a node with CPUs joins, as an autoscaling cluster makes one do;"
            " otherwise stop with Ctrl-C and add a worker node (`ray start --address HEAD:PORT --num-cpus N`"
            " on a machine of the cluster), give the head CPUs (`ray start --head --num-cpus N`), or run"
            " without --ray-address to start a local Ray instance."
        )

    def _node_cpus(self) -> list[float] | None:
        """The CPUs each live node of the cluster offers to tasks, or None if the cluster cannot say."""
        try:
            nodes = self.ray.nodes()
        except Exception:  # noqa: BLE001 - for the caller to do without
            return None
        return [node["Resources"].get("CPU", 0.0) for node in nodes if node["Alive"]]

    def __exit__(self, *exc_info: object) -> None:
        try:
            for results in self._maps:
                results.close()  # cancels its chunks in flight and waits for them
        finally:
            self._shut_down()

    def _shut_down(self) -> None:
        with self._local:
            if self._started:
                try:
                    with sigterm_kept(defer=True):
                        self.ray.shutdown()  # disconnects; a local instance started here stops with its workers
                finally:
                    if self._watcher is not None:
                        self._watcher.close()

    def _stop_half_started(self, before: dict[int, str]) -> None:
        """After ray.init was interrupted: kill what it started (the processes of this one not among
        `before`), then shut down what the driver holds of it.

        Killed first, all at once: a raylet still starting starts Ray's agents, which ray.shutdown would
        leave running (parentless, waiting for a GCS that is gone) once it had stopped the raylet."""
        if sys.platform.startswith("linux"):
            _kill_left(_frozen_descendants(os.getpid(), before))
        try:
            with sigterm_kept(defer=True):
                self.ray.shutdown()
        except Exception:  # noqa: BLE001 - half started: what it started is killed already
            pass

    def cpus(self) -> int:
        """The CPUs of the cluster (at least 1)."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def ordered_map(
        self,
        function: Callable[..., Result],
        tasks: Sequence[tuple],
        *,
        what: str,
        name: Callable[[tuple], str] = repr,
    ) -> Generator[Result, None, None]:
        """`function(*task)` for every task as Ray tasks, yielded in task order, a bounded number in
        flight. `what` names the work and `name(task)` the tasks in the error if a chunk fails for good.

        Leaving the engine's `with` block ends the map: chunks in flight are cancelled and waited for."""
        if not self._entered:
            raise RuntimeError("use RayEngine in a with block")
        if tasks and self._remote is None:
            self._start()
        results = self._ordered(function, tasks, what, name)
        self._maps.append(results)
        return results

    def _ordered(
        self, function: Callable[..., Result], tasks: Sequence[tuple], what: str, name: Callable[[tuple], str]
    ) -> Generator[Result, None, None]:
        if not tasks:
            return
        ray = self.ray
        cpus = self.cpus()
        size = chunk_size(len(tasks), cpus)
        starts = range(0, len(tasks), size)
        pending: deque[tuple[int, int, Any]] = deque()  # (first task, task after the last, its Ray task)
        submitted = iter(starts)
        attempts: dict[int, int] = {}  # chunk start -> retries so far

        def submit(start: int, stop: int) -> tuple[int, int, Any]:
            return start, stop, self._remote.remote(function, list(tasks[start:stop]), shardprep_code())

        try:
            for start in submitted:
                pending.append(submit(start, min(start + size, len(tasks))))
                if len(pending) >= CHUNKS_PER_CPU * cpus:
                    break
            while pending:
                start, stop, ref = pending[0]
                try:
                    while not ray.wait([ref], timeout=self.cpu_wait / 4)[0]:
                        self._check_runnable(after=self.cpu_wait)
                    results, failure = ray.get(ref)
                except ray.exceptions.RayTaskError as error:  # the function raised: as itself if ordinary
                    if str(error.cause).startswith(
                        f"{_run_chunk.__name__}() takes"
                    ):  # a node's older _run_chunk
                        raise _other_shardprep(error.cause) from None
                    if isinstance(error.cause, Exception) and _not_loaded(error) is None:
                        raise error.cause from error
                    names = [name(task) for task in tasks[start:stop]]
                    raise self._failed(what, names, error, retried=attempts.get(start, 0)) from None
                except ray.exceptions.RayError as error:  # Ray's own failure: retried if it may pass
                    names = [name(task) for task in tasks[start:stop]]
                    notice = retry_notice(error)
                    attempt = attempts[start] = attempts.get(start, 0) + 1
                    if notice is None or attempt > RETRIES:
                        raise self._failed(what, names, error, retried=attempt - 1) from None
                    delay = self.retry_delay * 2 ** (attempt - 1)
                    self.notify(
                        f"{what}: {notice} on {', '.join(names)} ({_first_line(error)});"
                        f" retrying in {delay:g} s (retry {attempt} of {RETRIES})"
                    )
                    time.sleep(delay)
                    pending[0] = submit(start, stop)
                    continue
                self._cpus.ended()  # a task ran
                if failure == _RERUN:  # raised after these, and cannot be returned: the rest again
                    pending[0] = submit(start + len(results), stop)
                else:
                    pending.popleft()
                    following = next(submitted, None) if failure is None else None
                    if following is not None:
                        pending.append(submit(following, min(following + size, len(tasks))))
                yield from results
                if isinstance(failure, SystemExit):  # not the driver's to exit with: the run's error
                    failed = [name(tasks[start + len(results)])]
                    raise self._failed(what, failed, failure, retried=attempts.get(start, 0))
                if isinstance(failure, Exception):
                    raise failure
        finally:
            self._stop([ref for _, _, ref in pending])

    def _stop(self, refs: list[Any]) -> None:
        """Cancel `refs` and wait until they have ended, so that no task still writes when the caller
        cleans up (a chunk that writes files, as `write` does, would otherwise leave some behind).

        Chunks get `STOP_GRACE` seconds to end by themselves; only those still running then are
        cancelled, killed with their worker. Ray 2.60's driver aborts the whole process ("An unexpected
        system state has occurred", task_manager.cc) when a cancel, forced or not, crosses the start or
        the reply of the task it cancels, which cancelling chunks just submitted made likely. Where no
        live node can run a task (`unrunnable`), no chunk has started or can start: all are cancelled at
        once, which Ray does on the spot for a task still waiting for a node."""
        ray = self.ray
        if not refs:
            return
        node_cpus = self._node_cpus()
        if node_cpus is not None and unrunnable(node_cpus) is not None:
            running = refs
        else:
            _, running = ray.wait(refs, num_returns=len(refs), timeout=STOP_GRACE)
        for ref in running:
            ray.cancel(ref, force=True)
        for ref in refs:
            try:
                ray.get(ref, timeout=STOP_TIMEOUT)
            except Exception:  # cancelled, failed or timed out: it is over, or will be killed with Ray
                pass

    def _failed(self, what: str, names: list[str], error: BaseException, retried: int = 0) -> PrepError:
        """The run's error for a chunk (its tasks `names`) that failed for good after `retried` retries."""
        where = f"A Ray task {what} on {', '.join(names)}"
        if retry_notice(error) is not None:  # a failure that is retried, RETRIES times by now
            return PrepError(
                f"{where} failed for good (retried {retried} times): {_first_line(error)}. Nothing was"
                " written; run again (with --resume, what was finished is kept)."
            )
        from ray import exceptions as ray_failed

        # what the task raised: a RayTaskError's cause, or the SystemExit a chunk returned
        cause = error if isinstance(error, SystemExit) else getattr(error, "cause", None)
        if isinstance(error, (ray_failed.RayTaskError, SystemExit)) and not isinstance(cause, Exception):
            why = (
                f"it raised {type(cause).__name__}: {_first_line(cause)}, which is not an ordinary exception"
                " (a BaseException, not an Exception)"
            )
            fix = "It came from the function the task runs, not from Ray"
        elif (not_loaded := _not_loaded(error)) is not None:
            why = f"a worker could not load it ({not_loaded})"
            fix = (
                "Every worker needs shardprep installed, the version this machine runs, and the dataset"
                " at the same path"
            )
        elif isinstance(error, ray_failed.RuntimeEnvSetupError):
            why = f"Ray could not set up its runtime environment ({_last_line(error.error_message or error)})"
            fix = "Check the runtime_env the job or the cluster gives its tasks"
        else:
            why = f"{type(error).__name__}: {_first_line(error)}"
            fix = "Ray would fail it the same way again; see the cluster's logs (`ray logs`)"
        after = f" after {retried} retries for other failures" if retried else ""
        return PrepError(
            f"{where} failed{after} in a way a retry would not mend, so it was not retried: {why}. {fix}."
            " Nothing was written; run again once that is put right (with --resume, what was finished is"
            " kept)."
        )


def _first_line(error: object) -> str:
    """The first line of what `error` says, to go inside a sentence (without a full stop of its own).

    >>> _first_line(ValueError("See the logs for more information.\\nTraceback ...")), _first_line(ValueError())
    ('See the logs for more information', 'ValueError')
    """
    text = str(error).strip()
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__


def _last_line(error: object) -> str:
    """The last line of what `error` says, as `_first_line` gives the first."""
    text = str(error).strip()
    return text.splitlines()[-1].rstrip(".") if text else type(error).__name__


def _to_stderr(message: str) -> None:
    """A notice on a line of its own (after the progress line, if one is drawn)."""
    sys.stderr.write(("\n" if sys.stderr.isatty() else "") + message + "\n")
    sys.stderr.flush()
