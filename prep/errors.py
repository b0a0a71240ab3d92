"""Errors that end a run with one clear paragraph instead of a traceback."""

from __future__ import annotations


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
