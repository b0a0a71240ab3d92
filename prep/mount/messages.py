"""Where the mount's server says what its user needs to know while it serves (a shard changed, files
still open at Ctrl-C, a kernel it cannot speak to).

In the foreground that is stderr. A server in the background has no terminal, so, as daemons do, it
appends to a log file the user names, or else sends to syslog where there is one (`/dev/log`); with
neither, its messages are not kept. The log file is opened by the process that mounts, before it forks
the server, so a path it cannot write is an error at once, and the server inherits the open file. A
mount that fails leaves no log file it created and never wrote to (`with messages:` around the mount);
a file that was there before is only appended to, its mode left as its owner set it.
"""

from __future__ import annotations

import errno
import os
import sys
import syslog
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from prep.errors import PrepError

SYSLOG_IDENT = "shardprep-mount"
SYSLOG_SOCKET = "/dev/log"
SYSLOG_WHERE = f"syslog (journalctl -t {SYSLOG_IDENT})"
#: Appended to, created private to the user, never through a link planted at the last component.
LOG_FILE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
LOG_FILE_MODE = 0o600


@dataclass(frozen=True)
class Messages:
    """One destination of the server's messages: `say` one line there. `where` names it for the user
    (None: the messages are not kept). Used as a context manager around mounting, it `forget`s what it
    made if the mount fails."""

    where: str | None
    say: Callable[[str], None]
    close: Callable[[], None] = lambda: None
    #: Close, and remove what opening made (a log file created here and still empty).
    forget: Callable[[], None] = lambda: None

    def __enter__(self) -> Messages:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is not None:
            self.forget()


def _to_stderr(text: str) -> None:
    print(f"shardprep mount: {text}", file=sys.stderr, flush=True)


STDERR = Messages("stderr", _to_stderr)


class _LogFile:
    """A log file open for appending, and whether this process created it (its device and inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._created: tuple[int, int] | None = None
        try:
            try:  # O_EXCL: created here, so a failed mount removes it; a link planted there is EEXIST too
                self._descriptor = os.open(path, LOG_FILE_FLAGS | os.O_EXCL, LOG_FILE_MODE)
            except FileExistsError:
                self._descriptor = os.open(path, LOG_FILE_FLAGS)
            else:
                found = os.fstat(self._descriptor)
                self._created = (found.st_dev, found.st_ino)
        except OSError as error:
            why = "it is a symbolic link" if error.errno == errno.ELOOP else error.strerror
            raise PrepError(
                f"The log file {path} cannot be opened for appending: {why}. Give a file in a folder you can"
                " write (it is created with mode 600 if missing)."
            ) from None

    def write(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:  # one write of the whole line: lines of several writers never interleave
            os.write(self._descriptor, f"{stamp} shardprep mount[{os.getpid()}]: {text}\n".encode())
        except OSError:  # a full disk must not change what the reader is answered
            pass

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1

    def forget(self) -> None:
        """Close; remove the file if this process created it and nothing has been written to it."""
        self.close()
        try:
            found = os.lstat(self.path)
        except OSError:
            return
        if (found.st_dev, found.st_ino) == self._created and found.st_size == 0:
            os.unlink(self.path)


def to_log_file(path: Path) -> Messages:
    """Append messages to `path`, one timestamped line each; PrepError naming it if it cannot be opened."""
    log = _LogFile(path)
    return Messages(str(path), log.write, log.close, log.forget)


def _to_syslog(text: str) -> None:
    syslog.syslog(syslog.LOG_WARNING, text)


def in_background(log_file: Path | None) -> Messages:
    """Where a server in the background sends its messages: `log_file` if given, else syslog if there is
    one, else nowhere."""
    if log_file is not None:
        return to_log_file(log_file)
    if os.path.exists(SYSLOG_SOCKET):
        syslog.openlog(SYSLOG_IDENT, syslog.LOG_PID, syslog.LOG_USER)
        return Messages(SYSLOG_WHERE, _to_syslog)
    return Messages(None, lambda text: None)
