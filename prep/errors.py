"""Errors that end a run with one clear paragraph instead of a traceback."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class PrepError(Exception):
    """A problem with the user's input or environment, explained in one paragraph."""

    exit_code = 1


class ShardError(PrepError):
    """A shard that cannot be indexed: names the shard, the byte offset where it applies, and what to do."""

    def __init__(self, shard: str, problem: str, offset: int | None = None, advice: str = "") -> None:
        self.shard = shard
        self.problem = problem
        self.offset = offset
        self.advice = advice
        where = f"{shard}" if offset is None else f"{shard} at byte {offset}"
        text = f"{where}: {problem}"
        if advice:
            text += f" {advice}"
        super().__init__(text)

    def __reduce__(self) -> tuple:
        # Crosses process boundaries from the scanning workers intact.
        return (self.__class__, (self.shard, self.problem, self.offset, self.advice))


#: How many problems one report lists before summarising the rest.
MAX_REPORTED_ERRORS = 10


def errors_report(errors: Sequence[PrepError], headline: str) -> PrepError:
    """One error for a run's problems: the problem itself if there is one, else `headline` (which follows
    the count, e.g. "problems; nothing was written") and the first ones, one per line.

    >>> print(errors_report([PrepError("a"), PrepError("b")], "problems; nothing was written:"))
    2 problems; nothing was written:
      - a
      - b
    """
    if len(errors) == 1:
        return errors[0]
    lines = [f"{len(errors)} {headline}"]
    lines += [f"  - {error}" for error in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"  ... and {len(errors) - MAX_REPORTED_ERRORS} more.")
    return PrepError("\n".join(lines))


#: errno values a run reports as a clear message (the disk, the filesystem, the permissions), not a traceback.
_FULL = {errno.ENOSPC, errno.EDQUOT}
_REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def plain_io_errors(root: Path | str, command: str) -> Iterator[None]:
    """Turn a full disk, a read-only filesystem or a refused permission met while `command` works on
    `root` into a PrepError that says so. Runs stage everything and put nothing in place on an error, so
    the message can promise that what was there before is untouched."""
    try:
        yield
    except sqlite3.OperationalError as error:
        text = str(error)
        if "full" in text:
            raise PrepError(_full(root, command, "the index database")) from None
        if "readonly" in text or "read-only" in text:
            raise PrepError(
                _refused(root, command, "the index database", "the filesystem is read-only")
            ) from None
        raise
    except OSError as error:
        where = error.filename or root
        if error.errno in _FULL:
            raise PrepError(_full(root, command, where)) from None
        if error.errno in _REFUSED:
            raise PrepError(_refused(root, command, where, error.strerror or "refused")) from None
        raise


def _full(root: Path | str, command: str, where: object) -> str:
    return (
        f"No space left on the device while {command} wrote {where}. Nothing was put in place: {root} is as"
        " it was before the run. Free some space there and run again."
    )


def _refused(root: Path | str, command: str, where: object, why: str) -> str:
    return (
        f"{command} could not write {where}: {why}. Nothing was put in place: {root} is as it was before the"
        " run. Run it where it may write (check the folder's permissions, or that it is not mounted read-only)."
    )
