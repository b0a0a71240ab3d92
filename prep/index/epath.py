"""How energon's loader reads a path inside a storage profile (its `EPath`): lexically, whatever the
storage holds, `//` and `.` parts dropped and each `..` taking back the part before it; a path that climbs
above the top is refused (energon's "Path above root").

>>> resolved_parts("a//b/./c/../d/"), resolved_parts("a/../../x")
(['a', 'b', 'd'], None)
"""

from __future__ import annotations


def resolved_parts(path: str) -> list[str] | None:
    """The parts of the `/`-separated `path` as energon reads it, or None where it climbs above its top."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return parts
