"""What a mounted dataset looks like to the FUSE session: nodes, listings, and the tree that answers them.

The session (`prep.mount.session`) speaks the kernel's protocol and knows nothing of datasets; the tree
(`prep.mount.tree`) knows the dataset and nothing of the protocol. This is all they share: a `Tree` is
anything that resolves names to `Node`s, lists folders a page at a time, and reads files' bytes, and the
error by which it says it has told the user of a failure itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

#: The kernel's id of the mount's root folder.
ROOT_ID = 1
#: Cookies 1 and 2 are `.` and `..` (the session lists them); a folder's own entries start at this cookie.
FIRST_COOKIE = 3


class Node(NamedTuple):
    """What a name leads to: a folder, or a file of `size` bytes (a tuple: one is made per lookup)."""

    id: int
    is_dir: bool
    size: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of one folder's entries, all folders or all files (no view mixes them in one folder).

    Each entry is `(shown name, node id, size, cookie)`, the cookie being where a listing resumes after
    it; plain tuples, since a big folder lists hundreds of thousands of them.
    """

    is_dir: bool
    entries: list[tuple[str, int, int, int]]


class AlreadyToldError(OSError):
    """An I/O error the tree has already told its user about, in words of the dataset (a shard changed:
    prepare again); the session answers it EIO and tells nothing more of it."""


class Tree(Protocol):
    """A read-only folder tree, safe to use from several threads."""

    def lookup(self, parent: int, name: str) -> Node | None:
        """The node called `name` in folder `parent`, or None if there is none."""

    def node(self, node: int) -> Node | None:
        """The node behind an id the kernel holds (for its attributes), or None if there is none."""

    def list_dir(self, folder: int, after: int = 0, limit: int = 1024) -> Listing:
        """Up to `limit` entries of a folder after cookie `after` (0: from the start; `.` and `..` are
        the session's). NotADirectoryError for a file, FileNotFoundError for an id that is no folder."""

    def path(self, node: int) -> str | None:
        """Where a node is shown under the mount (`/` its root), for messages; None if there is none."""

    def usage(self) -> tuple[int, int]:
        """(bytes, files) the tree shows, for `df`."""

    def read(self, node: int, offset: int, size: int) -> bytes:
        """Bytes `offset .. offset+size` of a file (fewer at its end); FileNotFoundError if no file."""

    def read_cached(self, node: int, offset: int, into: memoryview) -> memoryview:
        """`read` into `into` from the page cache only (the filled front of it); BlockingIOError if the
        disk would be needed."""

    def close(self) -> None:
        """Release what the tree holds open."""
