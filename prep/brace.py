"""Brace patterns for shard lists: collapse runs like `a/{000..009}.tar`, expand them back.

energon writes split lists collapsed (order kept) and expands them with the `braceexpand` package when
it loads; `collapse` is the inverse that keeps the listed order.
"""

from __future__ import annotations

import re

import braceexpand

_NUMBER = re.compile(r"\d+")


def _tokens(name: str) -> tuple[list[str], list[str]]:
    """Split a name into literal pieces and the digit runs between them (`len(literals) == len(digits) + 1`)."""
    literals: list[str] = []
    digits: list[str] = []
    position = 0
    for match in _NUMBER.finditer(name):
        literals.append(name[position : match.start()])
        digits.append(match.group())
        position = match.end()
    literals.append(name[position:])
    return literals, digits


def _changed_slot(previous: list[str], current: list[str]) -> int | None:
    """The one digit run that goes up by exactly one at the same width, else None."""
    changed = [slot for slot, (a, b) in enumerate(zip(previous, current, strict=True)) if a != b]
    if len(changed) != 1:
        return None
    slot = changed[0]
    a, b = previous[slot], current[slot]
    if len(a) != len(b) or int(b) != int(a) + 1:
        return None
    return slot


def collapse(names: list[str]) -> list[str]:
    """Replace each run of names counting up in one number by a brace range, keeping the order.

    >>> collapse(["s/000.tar", "s/001.tar", "s/002.tar", "t.tar", "s/007.tar"])
    ['s/{000..002}.tar', 't.tar', 's/007.tar']
    """
    out: list[str] = []
    i = 0
    while i < len(names):
        literals, first = _tokens(names[i])
        slot: int | None = None
        last = first
        j = i + 1
        while j < len(names):
            next_literals, digits = _tokens(names[j])
            if next_literals != literals or len(digits) != len(first):
                break
            changed = _changed_slot(last, digits)
            if changed is None or (slot is not None and changed != slot):
                break
            slot, last = changed, digits
            j += 1
        if slot is None:
            out.append(names[i])
        else:
            pieces = [literals[0]]
            for k, run in enumerate(first):
                pieces.append(f"{{{run}..{last[k]}}}" if k == slot else run)
                pieces.append(literals[k + 1])
            out.append("".join(pieces))
        i = j if slot is not None else i + 1
    return out


def expand(patterns: list[str]) -> list[str]:
    """Expand brace patterns as energon does (the `braceexpand` package), in order."""
    return [name for pattern in patterns for name in braceexpand.braceexpand(pattern)]
