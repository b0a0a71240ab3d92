"""The pharaoh word-alignment format of parallel text, as fast_align writes it and OpenNMT-tf reads it:
one line per sentence pair, pairs `i-j` apart by spaces, source token i aligned to target token j, each
position counted from 0 in ASCII digits. `write --format parallel` checks alignment files with it, and
`cookers.translation` turns them into matrices.
"""

from __future__ import annotations


def pharaoh_pair(word: str) -> tuple[int, int] | None:
    """The (source, target) positions of one pair `i-j`, or None if `word` is not one. A position is ASCII
    digits only: `str.isdigit` alone also takes superscripts and other scripts' digits, which OpenNMT-tf's
    `tf.strings.to_number` does not read.

    >>> pharaoh_pair("2-11"), pharaoh_pair("2:11"), pharaoh_pair("²-1"), pharaoh_pair("０-１")
    ((2, 11), None, None, None)
    """
    left, dash, right = word.partition("-")
    if dash and left.isascii() and left.isdigit() and right.isascii() and right.isdigit():
        return int(left), int(right)
    return None
