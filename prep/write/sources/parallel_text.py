"""Parallel text: a source file and a target file, line-aligned, and optionally a pharaoh alignment file.

Each line number is one sample with parts `src.txt`, `tgt.txt` and `align.txt`. An alignment line is
space-separated `i-j` pairs of 0-based source and target token positions (whitespace tokens), each within
its sentence.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from prep.alignment import pharaoh_pair
from prep.errors import PrepError
from prep.write.sources import Record, Reject, Source, text_start


def alignment_problem(alignment: str, source: str, target: str) -> str | None:
    """Why a pharaoh alignment line does not fit its sentence pair, or None if it does.

    >>> alignment_problem("0-0 1-2", "a b", "x y z") is None, alignment_problem("2-0", "a b", "x")
    (True, 'source position 2 is past the 2 source tokens')
    """
    source_length, target_length = len(source.split()), len(target.split())
    for word in alignment.split():
        pair = pharaoh_pair(word)
        if pair is None:
            return f"{word!r} is not a pharaoh pair i-j"
        if pair[0] >= source_length:
            return f"source position {pair[0]} is past the {source_length} source tokens"
        if pair[1] >= target_length:
            return f"target position {pair[1]} is past the {target_length} target tokens"
    return None


class ParallelTextSource:
    """Records from line-aligned source/target(/alignment) files; unequal line counts are a Reject."""

    def __init__(self, source: Path, target: Path, alignment: Path | None = None) -> None:
        self.paths = [path for path in (source, target, alignment) if path is not None]
        self.name = str(source)
        fields = ("src", "tgt", "align")[: len(self.paths)]
        self.fields = fields
        self.default_parts = [(field, f"{field}.txt") for field in fields]

    @classmethod
    def open(cls, paths: list[Path], columns: list[str] | None = None) -> list[Source]:
        """One source of all the paths: SOURCE TARGET [ALIGNMENT], line-aligned."""
        if len(paths) not in (2, 3):
            raise PrepError(
                "--format parallel takes a source file, a target file and optionally a pharaoh alignment"
                f" file, line-aligned; got {len(paths)} paths."
            )
        return [cls(*paths)]

    def records(self) -> Iterator[Record | Reject]:
        """One record per line number; a line that is not UTF-8 is a Reject naming its file, line and
        byte offset (each file is decoded line by line, after its byte order mark)."""
        starts = [text_start(path) for path in self.paths]
        files = [open(path, "rb") for path in self.paths]  # noqa: SIM115
        try:
            for file, start in zip(files, starts, strict=True):
                file.seek(start)
            for number, lines in enumerate(itertools.zip_longest(*files), 1):
                where = f"{self.name}:{number}"
                if any(line is None for line in lines):
                    ended = [str(path) for path, line in zip(self.paths, lines, strict=True) if line is None]
                    yield Reject(
                        where,
                        f"{', '.join(ended)} ended before line {number}: the files are not line-aligned",
                    )
                    return
                texts, bad = [], None
                for index, line in enumerate(lines):
                    try:
                        texts.append(line.decode("utf-8").rstrip("\r\n"))
                    except UnicodeDecodeError as error:
                        bad = bad or Reject(
                            f"{self.paths[index]}:{number}",
                            f"not UTF-8 text ({error.reason} at byte {starts[index] + error.start})",
                            line.decode("utf-8", "replace").rstrip("\r\n"),
                        )
                    starts[index] += len(line)
                if bad is not None:
                    yield bad
                    continue
                fields = dict(zip(self.fields, texts, strict=True))
                if "align" in fields:
                    problem = alignment_problem(fields["align"], fields["src"], fields["tgt"])
                    if problem:
                        yield Reject(f"{self.paths[2]}:{number}", f"alignment {problem}", fields["align"])
                        continue
                yield Record(fields, where)
        finally:
            for file in files:
                file.close()
