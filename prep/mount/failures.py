"""Requests the mount's server answered with an I/O error because something went wrong, told to its user
without a flood.

Such a request (the index gone from under the mount, a folder where a shard was, a bug) is only EIO to
the program that made it; what went wrong is known to the server alone, so it says so in its messages
(`prep.mount.messages`). Each kind of failure — the request and the exception's type — is told in full
the first FULL_PER_KIND times, naming the request, the path it named and the exception. After that it is
only counted: the counts are told when the next failure comes COUNTS_EVERY_SECONDS or more after the
last counts were, and when the mount ends. Nothing here runs for a request that succeeds.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable

FULL_PER_KIND = 3
COUNTS_EVERY_SECONDS = 60.0


def _exception(error: BaseException) -> str:
    """The exception's type and text and the line that raised it, on one line.

    >>> try:
    ...     {}["shard-001.tar"]
    ... except KeyError as error:
    ...     print(_exception(error))  # doctest: +ELLIPSIS
    KeyError: 'shard-001.tar' (raised at <doctest ...>:2 in <module>)
    """
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


class FailedRequests:
    """Tells failed requests through `say`, each kind FULL_PER_KIND times in full, then by count. Safe to
    use from several threads (the serving loop and its pool of reads)."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._say = say
        self._clock = clock
        self._lock = threading.Lock()
        self._told: Counter[tuple[str, str]] = Counter()  # by (request, exception type): told in full
        self._counted: Counter[tuple[str, str]] = Counter()  # failures since the counts were last told
        self._counts_told_at = clock()

    def failed(self, request: str, what: Callable[[], str], error: BaseException) -> None:
        """`request` (e.g. READ) was answered EIO because of `error`. `what` names what it asked for (a
        path, a range); it is called only for a failure told in full."""
        kind = (request, type(error).__name__)
        with self._lock:
            if self._told[kind] < FULL_PER_KIND:
                self._told[kind] += 1
                more = " Further ones like it are counted." if self._told[kind] == FULL_PER_KIND else ""
                self._say(f"{request} of {what()} answered as an I/O error: {_exception(error)}.{more}")
                return
            self._counted[kind] += 1
            if self._clock() - self._counts_told_at >= COUNTS_EVERY_SECONDS:
                self._tell_counts()

    def close(self) -> None:
        """Tell the failures counted and not yet told (the mount ends)."""
        with self._lock:
            self._tell_counts()

    def _tell_counts(self) -> None:
        for (request, exception), count in sorted(self._counted.items()):
            self._say(f"{count} more {request} request{'s' * (count != 1)} failed with {exception}.")
        self._counted.clear()
        self._counts_told_at = self._clock()
