"""The Ray engine on a real local Ray instance of 2 CPUs, started and stopped by this module: results in
task order, a worker that dies retried after a pause and announced, a task that keeps dying named in
one clear error, a failure a retry would not mend named at once, and Ray's absence a one-line error
naming the extra. On a cluster's head of its own (token authentication, no CPU, started through `ray
start`): a token refused named at once, and tasks left without a CPU mid-run said once."""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep.engines.ray_cluster import (
    RAY_EXTRA,
    RETRIES,
    RayEngine,
    _descendants,
    _process_start,
    _run_chunk,
    import_ray,
    retry_notice,
    shardprep_code,
    sigterm_kept,
)
from prep.errors import PrepError
from tests.support.leftovers import processes_mentioning
from tests.support.prepare import run_shardprep
from tests.support.ray import RayNode, local_ray, ray_head

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray instance with 2 CPUs, shut down after the module's tests (yields the `ray` module)."""
    yield from local_ray(tmp_path_factory)


@pytest.fixture(scope="module")
def token_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The head of a Ray cluster that asks for a token (token authentication) and offers no CPU to tasks,
    as a head whose workers join later does; stopped after the module's tests. Yields its address and the
    file that holds its token."""
    folder = tmp_path_factory.mktemp("head")
    token = folder / "token"
    token.write_text(secrets.token_hex(32))
    for address in ray_head(folder, cpus=0, token=token):
        yield address, token


def square(number: int) -> int:
    return number * number


def die_once(marker: str, number: int) -> int:
    """Kill the worker process the first time any task runs (the marker remembers it), then work."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))  # only one task, however many run at once
    except FileExistsError:
        return number + 1
    os._exit(1)


def always_die(number: int) -> int:
    os._exit(1)


def test_results_come_back_in_task_order_however_many_tasks(cluster) -> None:
    tasks = [(number,) for number in range(500)]
    with RayEngine() as engine:
        assert list(engine.ordered_map(square, tasks, what="squaring")) == [n * n for n in range(500)]
    assert cluster.is_initialized(), "a Ray the caller started is left running"


def test_a_worker_killed_mid_run_is_retried_after_a_pause_and_named(cluster, tmp_path: Path) -> None:
    tasks = [(str(tmp_path / "died"), number) for number in range(10)]
    notices: list[str] = []
    started = time.monotonic()
    with RayEngine(retry_delay=0.2, notify=notices.append) as engine:
        results = list(engine.ordered_map(die_once, tasks, what="counting", name=lambda task: f"t{task[1]}"))
    assert results == list(range(1, 11))
    assert (tmp_path / "died").exists(), "no worker died: the test proved nothing"
    assert len(notices) == 1 and "counting: a Ray worker died on t" in notices[0], notices
    assert f"retry 1 of {RETRIES}" in notices[0] and time.monotonic() - started >= 0.2


def test_a_task_that_keeps_failing_is_named_in_one_clear_error(cluster) -> None:
    notices: list[str] = []
    with RayEngine(retry_delay=0.01, notify=notices.append) as engine, pytest.raises(PrepError) as raised:
        list(engine.ordered_map(always_die, [(7,)], what="counting", name=lambda task: f"task-{task[0]}"))
    message = str(raised.value)
    assert "task-7" in message and f"retried {RETRIES} times" in message and "counting" in message
    assert [notice.split("(retry ")[1] for notice in notices] == [f"{n} of {RETRIES})" for n in (1, 2, 3)]


def test_without_ray_the_error_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    with pytest.raises(PrepError) as raised:
        import_ray()
    message = str(raised.value)
    assert f"pip install {RAY_EXTRA}" in message and "\n" not in message


DRIVER = """
import subprocess, time
from prep.engines.ray_cluster import RayEngine
# the program's own child, started before Ray: not Ray's to end
own = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with RayEngine(workers=1) as engine:
    list(engine.ordered_map(abs, [(-1,)], what="warming up"))
    print("ready", flush=True)
    print(own.pid, flush=True)
    time.sleep(120)
"""


def ray_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a driver whose local Ray instance keeps its files (and so names in its processes'
    command lines) a short path under the test's temporary folder (Ray's socket paths must stay short),
    with an empty home folder of its own and no choice of Ray's token authentication, as a user's."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_AUTH_")}
    return {
        **env,
        "RAY_TMPDIR": str(tmp_path_factory.mktemp("r")),
        "HOME": str(tmp_path_factory.mktemp("home")),
    }


def start_driver(script: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.Popen, dict]:
    """Run `script` (which prints "ready" once its local Ray instance is up) as a driver process; return
    it and its descendants as they are at that moment (pid -> start time)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    driver = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=ray_files(tmp_path_factory),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == "ready\n"
    except BaseException:
        driver.kill()
        driver.communicate()
        raise
    return driver, _descendants(driver.pid)


def test_no_process_of_a_local_instance_outlives_a_killed_driver(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Each process of the instance goes with the driver; the driver's own child started before Ray
    stays (in a Python program, it is not Ray's)."""
    driver, started = start_driver(DRIVER, tmp_path_factory)
    try:
        assert driver.stdout is not None
        own = int(driver.stdout.readline())
        own_start = started.pop(own)
        assert len(started) >= 3, "expected Ray's servers and workers under the driver"
    finally:
        driver.kill()
        driver.communicate()
    deadline = time.monotonic() + 10
    while (alive := [pid for pid, start in started.items() if _process_start(pid) == start]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    try:
        assert not alive, f"processes of the killed driver's Ray instance left running: {alive}"
        assert _process_start(own) == own_start, "the driver's own child was killed with its Ray instance"
    finally:
        os.kill(own, signal.SIGKILL)


INTERRUPTED_DRIVER = """
import signal, time
from prep.engines.ray_cluster import RayEngine

def interrupt(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, interrupt)  # as every shardprep command does (prep.cli.stop_on_sigterm)
try:
    with RayEngine(workers=1) as engine:
        list(engine.ordered_map(abs, [(-1,)], what="warming up"))  # Ray starts with the first work
        print("ready", flush=True)
        list(engine.ordered_map(time.sleep, [(60,)], what="sleeping"))
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_unwinds_the_driver_like_ctrl_c_and_stops_the_local_instance(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    driver, started = start_driver(INTERRUPTED_DRIVER, tmp_path_factory)
    try:
        time.sleep(0.5)
        driver.terminate()
        out, err = driver.communicate(timeout=30)
    finally:
        driver.kill()
    assert driver.returncode == 0 and out == "interrupted\n", err
    assert "SIGTERM received" not in err, "Ray's own SIGTERM handler ran"
    assert not [pid for pid, start in started.items() if _process_start(pid) == start]


def raises_type_error(number: int) -> int:
    raise TypeError(f"{number} is not what this node's code takes")


def test_a_task_failing_on_a_node_with_other_shardprep_code_says_so() -> None:
    """A node whose shardprep is not the driver's (another version, another checkout) fails tasks with
    errors that only make sense as a mismatch (a function taking other arguments): said so, naming the
    node, not as the bare TypeError."""
    with pytest.raises(
        PrepError, match=r"The node .* runs another shardprep than this machine .*TypeError: 1 is"
    ):
        _run_chunk(raises_type_error, [(1,)], "the driver's other code")
    with pytest.raises(TypeError):  # the same code: the task's own error
        _run_chunk(raises_type_error, [(1,)], shardprep_code())


SIGTERM_IN_SHUTDOWN_DRIVER = """
import os, signal, threading, time
from prep.engines.ray_cluster import RayEngine

def interrupt(signum, frame):
    raise KeyboardInterrupt

def caught():
    line = next(l for l in open("/proc/self/status") if l.startswith("SigCgt"))
    return int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1

def terminate_during_shutdown(shutting_down):
    shutting_down.wait()
    time.sleep(0.5)  # well into ray.shutdown, which takes about a second
    os.kill(os.getpid(), signal.SIGTERM)

signal.signal(signal.SIGTERM, interrupt)  # as every shardprep command does (prep.cli.stop_on_sigterm)
shutting_down = threading.Event()
threading.Thread(target=terminate_during_shutdown, args=(shutting_down,), daemon=True).start()
try:
    with RayEngine(workers=1) as engine:
        list(engine.ordered_map(abs, [(-1,)], what="warming up"))  # Ray starts with the first work
        print("ready", flush=True)
        shutting_down.set()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_while_ray_shuts_down_unwinds_like_ctrl_c(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Ray's core worker resets SIGTERM in the kernel to its default early in ray.shutdown, which then
    takes about a second to stop the instance's processes: a SIGTERM then killed the run outright (exit
    -15, no word, its staged files and scratch folder left), as it did when a bucket prepare with
    `--engine ray` was stopped just after its last shard was scanned."""
    driver, started = start_driver(SIGTERM_IN_SHUTDOWN_DRIVER, tmp_path_factory)
    try:
        out, err = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 0 and out == "interrupted\n", (driver.returncode, err[-2000:])
    assert not [pid for pid, start in started.items() if _process_start(pid) == start]


SHUT_DOWN_DRIVER = """
import os, signal
from prep.engines.ray_cluster import RayEngine

def interrupt(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, interrupt)
with RayEngine(workers=1) as engine:
    list(engine.ordered_map(abs, [(-1,)], what="warming up"))  # Ray starts with the first work
    print("ready", flush=True)
caught = int(next(l for l in open("/proc/self/status") if l.startswith("SigCgt")).split()[1], 16)
print("SIGTERM caught" if caught >> (signal.SIGTERM - 1) & 1 else "SIGTERM not caught", flush=True)
print(os.environ["HOME"], sorted(name for name in os.environ if name.startswith("RAY_AUTH_")), flush=True)
with RayEngine(workers=1) as engine:  # a second instance: Ray's driver still has the first's token
    print("again", *engine.ordered_map(abs, [(-2,)], what="again"), flush=True)
"""


@pytest.fixture(scope="module")
def finished_driver(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str]:
    """A driver that ran its local instance to the end (SHUT_DOWN_DRIVER): what it printed, and stderr."""
    driver, _ = start_driver(SHUT_DOWN_DRIVER, tmp_path_factory)
    out, err = driver.communicate(timeout=60)
    return out.splitlines(), err


def test_sigterm_still_unwinds_the_driver_after_the_instance_is_shut_down(
    finished_driver: tuple[list[str], str],
) -> None:
    """ray.shutdown resets SIGTERM in the kernel to its default (kill at once), though Python's table still
    names the command's handler: the rest of the run (the index written, put in place) would die mid-way."""
    out, err = finished_driver
    assert out[:1] == ["SIGTERM caught"], err


def test_a_local_instance_leaves_nothing_in_the_users_home(finished_driver: tuple[list[str], str]) -> None:
    """Ray 2.60 turns token authentication on for a local instance and, finding no token, writes one to
    ~/.ray/auth_token, which the user's next `ray start --head` finds and turns token authentication on
    with. The run's instance has a token of its own, in its environment only while it runs, and the same
    for a second instance of the process (Ray's driver keeps the first token it read)."""
    out, err = finished_driver
    home, auth = out[1].split(" ", 1)
    assert [path.name for path in Path(home).rglob("*")] == [] and auth == "[]", (out, err)
    assert out[2:] == ["again 2"], err


STARTING_DRIVER = """
import os, signal, threading, time
from pathlib import Path
from prep.engines.ray_cluster import RayEngine, _descendants

def interrupt(signum, frame):
    raise KeyboardInterrupt

def named(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # ended since
        return None

def terminate_once_ray_starts_its_servers():  # the raylet starts in the middle of ray.init
    while "raylet" not in [named(pid) for pid in _descendants(os.getpid())]:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)

signal.signal(signal.SIGTERM, interrupt)
threading.Thread(target=terminate_once_ray_starts_its_servers, daemon=True).start()
try:
    with RayEngine(workers=1) as engine:
        list(engine.ordered_map(abs, [(-1,)], what="warming up"))  # Ray starts with the first work
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_sigterm_while_ray_starts_unwinds_like_ctrl_c_and_leaves_no_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """ray.init puts in SIGTERM handlers of its own while it starts Ray's servers: a SIGTERM then exited
    at once with Ray's SystemExit (exit code 15 and no word, not the run's Ctrl-C), or was lost."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    env = ray_files(tmp_path_factory)
    driver = subprocess.Popen(
        [sys.executable, "-c", STARTING_DRIVER],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = driver.communicate(timeout=60)
    finally:
        driver.kill()
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(Path(env["RAY_TMPDIR"]))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of the interrupted start left running: {left}"
    assert (driver.returncode, out) == (0, "interrupted\n"), err


class Terminated(Exception):
    """What the test's SIGTERM handler raises."""


def terminated(signum: int, frame: object) -> None:
    raise Terminated


def test_a_sigterm_whose_exception_is_dropped_while_ray_starts_is_handled_after_it() -> None:
    """A handler that raises while Ray forks its servers raises into a fork hook, where Python prints the
    exception and drops it (a `prepare` sent SIGTERM as Ray started once went on and finished). A race
    that a real start shows only now and then: here Ray's call and the hook's dropping are played."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    before = signal.signal(signal.SIGTERM, terminated)
    try:
        with pytest.raises(Terminated), sigterm_kept():
            ray._private.utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # as ray.init does
            with contextlib.suppress(Terminated):  # as a fork hook does
                signal.raise_signal(signal.SIGTERM)
            handled_in_block = True
        assert handled_in_block and signal.getsignal(signal.SIGTERM) is terminated
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_unreachable_cluster_address_is_named_at_once(tmp_path: Path) -> None:
    """ray.init waits minutes on an address nothing answers; the run checks it first."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    (tmp_path / "a.tar").write_bytes(bytes(1024))
    started = time.monotonic()
    result = run_shardprep(
        "prepare", str(tmp_path), "--non-interactive", "--split-ratio", "1,0,0", "--crude",
        "--engine", "ray", "--ray-address", "127.0.0.1:1",
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "Could not reach the Ray cluster at 127.0.0.1:1 (Connection refused)" in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("auth", "said"),
    [
        ({}, "this run sends none: Ray sends one to an address given only with RAY_AUTH_MODE=token"),
        ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token, but none was found"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, "the token this run sends is not its"),
    ],
    ids=["token-mode-off", "no-token", "wrong-token"],
)
def test_a_cluster_that_refuses_the_runs_token_is_named_at_once_with_what_to_do(
    token_head: tuple[str, Path],
    auth: dict[str, str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ray start` turns token authentication on when it finds a token in ~/.ray, but a driver sends a
    token to an address given only with RAY_AUTH_MODE=token. ray.init tried for 20 s, warning each second
    (InvalidAuthToken), and then said only that it failed to connect; without a token, a traceback."""
    address, _ = token_head
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**auth, "HOME": str(tmp_path)}.items():  # no ~/.ray/auth_token
        monkeypatch.setenv(name, value)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.tar").write_bytes(bytes(1024))
    started = time.monotonic()
    result = run_shardprep(
        "prepare", str(tmp_path / "data"), "--non-interactive", "--split-ratio", "1,0,0", "--crude",
        "--engine", "ray", "--ray-address", address,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"The Ray cluster at {address} asks for a token, and {said}." in result.stderr
    assert "Run with RAY_AUTH_MODE=token and the cluster's token" in result.stderr
    assert result.stderr.count("InvalidAuthToken") <= 1 and time.monotonic() - started < 10


TOKEN_CHECK = """
import socket, sys, time
from prep.engines.ray_cluster import check_token
from prep.errors import PrepError

listener = socket.create_server(("127.0.0.1", 0))  # the kernel accepts connections: nothing answers
started = time.monotonic()
try:
    check_token(f"127.0.0.1:{listener.getsockname()[1]}", timeout=float(sys.argv[1]))
except PrepError as error:
    print(error)
print(time.monotonic() - started)
"""


def test_the_token_check_of_an_address_that_is_not_a_ray_cluster_gives_up_in_time() -> None:
    """An address that accepts a TCP connection but is not a Ray cluster: Ray's client waits 40 s there
    before it fails, and ray.init then for ever. The check gives up after its timeout, naming the address
    and what to give instead, and the process still ends at once (the client is left in a thread that does
    not hold it)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", TOKEN_CHECK, "1"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    said, took = result.stdout.splitlines()
    assert said.startswith("Nothing at 127.0.0.1:") and "answered as a Ray cluster within 1 s" in said, said
    assert 1 <= float(took) < 3 and time.monotonic() - started < 15, result.stdout


LEFT_DRIVER = """
import sys, time
from prep.engines.ray_cluster import RayEngine

with RayEngine(sys.argv[1], retry_delay=0.1, cpu_wait=0.4, notify=lambda line: print(line, flush=True)) as engine:
    for _ in engine.ordered_map(time.sleep, [(0,), (60,)], what="sleeping"):
        print("ran", flush=True)
"""


def test_tasks_left_without_a_cpu_mid_run_are_said_once_and_wait(
    token_head: tuple[str, Path], tmp_path: Path
) -> None:
    """The only node with CPUs leaves mid-run (as one an autoscaler scales down does): Ray keeps the task
    it was running, run again, waiting without a word until a node with CPUs joins. The run says so once,
    when that has lasted `cpu_wait` seconds, and keeps waiting."""
    address, token = token_head
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "HOME": str(tmp_path)}
    env = {**os.environ, **auth, "PYTHONPATH": str(REPO)}
    env.pop("RAY_AUTH_TOKEN", None)
    command = [sys.executable, "-c", LEFT_DRIVER, address]
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) as driver:
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in driver.stdout], daemon=True)
        reader.start()
        try:
            worker = RayNode([f"--address={address}", "--num-cpus=1"], token)  # the driver waits for it
            try:
                said = ""
                while "ran" not in said:
                    said = lines.get(timeout=60)
                worker.leave()
                said = ""
                with contextlib.suppress(queue.Empty):
                    while "no node of" not in said:
                        said += lines.get(timeout=10)
                    while True:  # 5 checks of the cluster after the note, no other note
                        said += lines.get(timeout=0.5)
                waiting = driver.poll() is None
            finally:
                worker.kill()
        finally:
            driver.kill()  # Ctrl-C ends the wait too, after STOP_GRACE (tests/prepare/test_engine_ray.py)
            driver.wait()
            reader.join(timeout=10)
    assert "sleeping: a Ray" in said and "retry 1 of" in said, said
    assert said.count("no node of") == 1 and waiting, said
    assert f"no node of the Ray cluster at {address} can run a task of this run now" in said
    assert "each asks for 1 CPU, and its one node offers no CPU to tasks" in said


def refuse(number: int) -> int:
    raise OSError(28, "No space left on device")


def test_an_exception_a_task_raises_comes_back_as_itself(cluster) -> None:
    with RayEngine() as engine, pytest.raises(OSError) as raised:
        list(engine.ordered_map(refuse, [(1,), (2,)], what="writing"))
    assert raised.value.errno == 28


def fail_at(bad: int, number: int, runs: str = "") -> int:
    if runs:  # one line per run of a task, from whichever worker runs it
        with open(runs, "a") as file:
            file.write(f"{number}\n")
    if number == bad:
        raise ValueError(f"task {number} refused")
    return number


def test_the_results_before_a_task_that_raises_come_back_first(cluster, tmp_path: Path) -> None:
    """Tasks go to Ray a chunk at a time (12 of 100 here): a task that raises in the middle of its chunk
    must not take the results of the tasks before it in the chunk with it. They come first, and then the
    exception, as from `prep.processes.ordered_map` (a write names the first bad record in input order so).
    The task that raised is not run again to raise it (a write would do its work twice)."""
    runs = tmp_path / "runs"
    got: list[int] = []
    tasks = [(33, number, str(runs)) for number in range(100)]
    with RayEngine() as engine, pytest.raises(ValueError, match="task 33 refused"):
        for result in engine.ordered_map(fail_at, tasks, what="checking"):
            got.append(result)
    assert got == list(range(33))
    assert runs.read_text().split().count("33") == 1


class Unpicklable(Exception):
    def __init__(self, number: int) -> None:
        super().__init__(f"task {number} refused")
        self.lock = __import__("threading").Lock()


def refuse_unpicklably(number: int) -> int:
    if number == 33:
        raise Unpicklable(number)
    return number


def test_an_exception_that_cannot_be_returned_still_comes_after_the_results_before_it(cluster) -> None:
    """An exception that cannot be pickled cannot come back beside its chunk's results: the chunk's
    remaining tasks run again, so that it is raised by Ray in its turn (as the text Ray makes of it)."""
    got: list[int] = []
    with RayEngine() as engine, pytest.raises(Exception, match="task 33 refused"):
        for result in engine.ordered_map(refuse_unpicklably, [(number,) for number in range(100)], what="x"):
            got.append(result)
    assert got == list(range(33))


def test_only_a_failure_a_rerun_may_get_past_is_retried() -> None:
    """A worker or node that died, a result lost, a wait timed out: run again. What would fail the same
    way every time (a runtime environment Ray cannot set up, a task a worker cannot load, a task the
    function's own exception ended) is not retried."""
    failed = pytest.importorskip("ray.exceptions", reason="Ray is not installed (pip install shardprep[ray])")
    retried = [
        failed.WorkerCrashedError(),
        failed.NodeDiedError("node gone"),
        failed.LocalRayletDiedError(),
        failed.OutOfMemoryError("killed for memory"),
        failed.OwnerDiedError("00", None, ""),
        failed.ObjectLostError("00", None, ""),
        failed.GetTimeoutError(),
    ]
    not_retried = [
        failed.RuntimeEnvSetupError("pip install failed"),
        failed.RaySystemError("No module named 'prep'"),
        failed.RayTaskError("f", "trace", ValueError("bad"), proctitle="p", pid=1, ip="127.0.0.1"),
        failed.TaskUnschedulableError("no node"),
        failed.AuthenticationError("no token"),
    ]
    assert [retry_notice(error) is not None for error in retried] == [True] * len(retried)
    assert [retry_notice(error) for error in not_retried] == [None] * len(not_retried)
    assert retry_notice(failed.WorkerCrashedError()) == "a Ray worker died"


class Explodes:
    """An argument that pickles, but cannot be unpickled (as a function a worker cannot import)."""

    def __reduce__(self):
        return (__import__, ("a_module_no_worker_has",))


def test_a_task_no_worker_can_load_is_named_at_once_with_what_to_do(cluster) -> None:
    notices: list[str] = []
    with RayEngine(retry_delay=5, notify=notices.append) as engine, pytest.raises(PrepError) as raised:
        list(engine.ordered_map(square, [(Explodes(),)], what="counting", name=lambda task: "shard-7.tar"))
    message = str(raised.value)
    assert "shard-7.tar" in message and "not retried" in message and "shardprep installed" in message
    assert "a_module_no_worker_has" in message and not notices


class Halt(BaseException):
    """Not an ordinary exception: `except Exception` lets it through."""


def halt(number: int) -> int:
    raise Halt(f"halted at {number}")


def test_a_task_ended_by_what_is_not_an_exception_is_named_as_not_retried(cluster) -> None:
    notices: list[str] = []
    with RayEngine(retry_delay=5, notify=notices.append) as engine, pytest.raises(PrepError) as raised:
        list(engine.ordered_map(halt, [(7,)], what="counting", name=lambda task: f"task-{task[0]}"))
    message = str(raised.value)
    assert "task-7" in message and "Halt: halted at 7" in message and "not retried" in message
    assert "retried 3 times" not in message and not notices


def leave(number: int) -> int:
    if number == 33:
        sys.exit(3)
    return number


def test_a_task_that_calls_sys_exit_is_named_once_and_not_retried(cluster) -> None:
    """Ray ends the worker of a task that raises SystemExit, which the driver sees as a worker that died
    and would retry: the chunk catches it and returns it, naming its task, after the results before it."""
    notices: list[str] = []
    got: list[int] = []
    tasks = [(number,) for number in range(100)]  # chunks of 12: task 33 is in the middle of one
    with RayEngine(retry_delay=5, notify=notices.append) as engine, pytest.raises(PrepError) as raised:
        for result in engine.ordered_map(leave, tasks, what="counting", name=lambda task: f"task-{task[0]}"):
            got.append(result)
    message = str(raised.value)
    assert "task-33" in message and "task-32" not in message and "SystemExit: 3" in message, message
    assert "not retried" in message and not notices and got == list(range(33))
