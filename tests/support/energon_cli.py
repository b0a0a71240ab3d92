"""`energon COMMAND ARGS` run for real, each in a process of its own, without paying for energon's import
every time.

Starting the `energon` script costs about 2 s, nearly all of it importing torch and energon, and the
suite runs it many times (every comparison with `energon prepare`). So one server process imports
energon's command line once (`megatron.energon.cli.main`), and for each command forks a child, which is
then what a run of the script would be: energon's own code in a process of its own, with the caller's
arguments, stdin, environment and folder, its output in files, its exit status the command's. The child
leads a process group of its own, so a command that overruns its time is killed with every process it
started. The server never runs a command itself, so each child starts from energon freshly imported.

The server reads its requests on stdin and ends when that closes (the test run ended, however it ended).
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: The server: import energon's command line, then fork a child per request. A request and a reply are
#: each a 4-byte length and JSON. The reply to a request is the child's pid, then its exit status.
_SERVER = r"""
import json, os, struct, sys, traceback

def receive():
    head = b""
    while len(head) < 4:
        chunk = os.read(0, 4 - len(head))
        if not chunk:
            return None
        head += chunk
    size, = struct.unpack("<I", head)
    body = b""
    while len(body) < size:
        chunk = os.read(0, size - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)

def send(value):
    body = json.dumps(value).encode()
    os.write(1, struct.pack("<I", len(body)) + body)

def child(request):
    os.setsid()
    for fd, (path, flags) in enumerate(
        [(request["stdin"], os.O_RDONLY), (request["stdout"], os.O_WRONLY), (request["stderr"], os.O_WRONLY)]
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["energon", *request["args"]]
    status = 0
    try:
        main()
    except SystemExit as exit:
        if isinstance(exit.code, int) or exit.code is None:
            status = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)

from megatron.energon.cli.main import main

send("ready")
while (request := receive()) is not None:
    pid = os.fork()
    if pid == 0:
        child(request)
    send(pid)
    _, status = os.waitpid(pid, 0)
    send(os.waitstatus_to_exitcode(status))
"""


class EnergonServer:
    """The server process (started on first use) and the one command it runs at a time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is not None:
            self.stop()  # it died (killed from outside): its pipes closed, a new one started
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C meant for the tests' children is not one for it
            )
            assert self._receive(120) == "ready", "energon's command line could not be imported"
        return self._process

    def _send(self, value: object) -> None:
        body = json.dumps(value).encode()
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(struct.pack("<I", len(body)) + body)
        self._process.stdin.flush()

    def _receive(self, timeout: float) -> object:
        assert self._process is not None and self._process.stdout is not None
        out = self._process.stdout.fileno()
        data = b""
        while True:
            if len(data) >= 4 and len(data) >= 4 + struct.unpack("<I", data[:4])[0]:
                return json.loads(data[4:])
            ready, _, _ = select.select([out], [], [], timeout)
            if not ready:
                raise TimeoutError
            chunk = os.read(out, 4 + (struct.unpack("<I", data[:4])[0] if len(data) >= 4 else 0) - len(data))
            if not chunk:
                raise RuntimeError("the energon server ended")
            data += chunk

    def run(
        self,
        args: list[str],
        *,
        input: str | None,
        cwd: Path | str | None,
        env: dict[str, str] | None,
        timeout: float,
    ) -> subprocess.CompletedProcess:
        """`energon ARGS` with `input` on stdin (none: closed), in `cwd`, with `env` (this process's by
        default); subprocess.TimeoutExpired after `timeout` s, once the command and its children are killed."""
        with self._lock, tempfile.TemporaryDirectory(prefix="energon-cli-") as folder:
            paths = {name: os.path.join(folder, name) for name in ("stdin", "stdout", "stderr")}
            Path(paths["stdin"]).write_text(input or "")
            for name in ("stdout", "stderr"):
                Path(paths[name]).touch()
            self._start()
            request = {
                "args": args,
                "env": dict(os.environ if env is None else env),
                "cwd": str(cwd or os.getcwd()),
                **paths,
            }
            self._send(request)
            pid = self._receive(30)
            try:
                status = self._receive(timeout)
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                self._receive(30)
                raise subprocess.TimeoutExpired(["energon", *args], timeout) from None
            finally:
                try:  # processes the command started and left running die with it, as a test's should
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return subprocess.CompletedProcess(
                ["energon", *args],
                status,
                Path(paths["stdout"]).read_text(errors="replace"),
                Path(paths["stderr"]).read_text(errors="replace"),
            )

    def stop(self) -> None:
        """End the server (closing its stdin ends it), wait for it, and close its pipes."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


SERVER = EnergonServer()
