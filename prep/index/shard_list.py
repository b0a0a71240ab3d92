"""Find a dataset's shards the way `energon prepare` does, and order them as energon numbers them."""

from __future__ import annotations

import os
import re
from pathlib import Path

from prep.errors import PrepError
from prep.index.format import SHARD_SUFFIXES


def shard_sort_key(name: str) -> tuple[str, ...]:
    """energon sorts shard paths component by component (as pathlib does), not as plain strings.

    >>> sorted(["a-b.tar", "a/b.tar"], key=shard_sort_key)
    ['a/b.tar', 'a-b.tar']
    """
    return tuple(name.split("/"))


def find_shards(root: Path) -> list[str]:
    """Every `*.tar` / `*.tgz` file below `root`, relative and sorted in energon's order.

    Like energon's glob, hidden files and folders are left out and symbolic links are followed, so a
    folder reachable by two paths is listed under both; a link back to an enclosing folder is not
    followed, so a cycle cannot loop.
    """
    found: list[str] = []

    def walk(folder: Path, relative: str, ancestors: frozenset[tuple[int, int]]) -> None:
        try:
            info = folder.stat()
        except OSError:
            return
        identity = (info.st_dev, info.st_ino)
        if identity in ancestors:
            return
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                name = f"{relative}{entry.name}"
                if entry.is_dir(follow_symlinks=True):
                    walk(Path(entry.path), name + "/", ancestors | {identity})
                elif entry.name.endswith(SHARD_SUFFIXES):
                    # A dangling link or an unreadable entry is still listed: indexing names the problem.
                    found.append(name)

    walk(root, "", frozenset())
    return sorted(found, key=shard_sort_key)


def exclude_shards(shards: list[str], pattern: str | None) -> list[str]:
    """Drop shards whose relative path matches `pattern` anywhere (`re.search`), as energon's --exclude."""
    if not pattern:
        return shards
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise PrepError(f"Invalid --exclude regex {pattern!r}: {error}.") from None
    return [shard for shard in shards if not regex.search(shard)]
