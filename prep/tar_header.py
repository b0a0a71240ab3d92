"""Read the numeric fields and the checksum of many tar header blocks at once, with numpy.

A tar header stores numbers as octal text and a checksum: the sum of its 512 bytes with the checksum
field itself counted as eight spaces. Both the scan (`prep.tar_scan`) and the index check (`prep.verify`)
read them for thousands of headers at a time, each header a row of a 2-D uint8 array.
"""

from __future__ import annotations

import numpy as np

BLOCK = 512
#: Where a header keeps its checksum.
CHECKSUM_FIELD = slice(148, 156)
_OUTSIDE_CHECKSUM = np.r_[0:148, 156:BLOCK]
#: How tar writers fill a numeric field of each width: that many octal digits, then a NUL.
_USUAL_DIGITS = {12: 11, 8: 6}
# float64 so the product runs in BLAS: exact, as 11 octal digits are 33 bits.
_DIGIT_WEIGHTS = {digits: 8.0 ** np.arange(digits - 1, -1, -1) for digits in _USUAL_DIGITS.values()}
#: What `str.strip` removes around the digits, as tarfile reads a field.
_WHITESPACE = np.frombuffer(b" \t\n\v\f\r\x1c\x1d\x1e\x1f", dtype=np.uint8)


def octal_fields(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of one numeric field per row, read as Python's `tarfile` reads octal.

    A field ends at its first NUL; what comes before must be one run of octal digits with only whitespace
    around it. Fields that do not (base-256 numbers, no digits at all, stray characters) are not ok and
    their value is meaningless.

    >>> octal_fields(np.frombuffer(b"00000000017\\0" b"     17     ", dtype=np.uint8).reshape(2, 12))
    (array([15, 15]), array([ True,  True]))
    """
    digits = _USUAL_DIGITS.get(fields.shape[1])
    if digits is None:
        return _octal_fields_general(fields)
    # The usual layout, read as one product with the digit weights; the rest take the general rule.
    head = fields[:, :digits] - np.uint8(48)  # a digit becomes 0..7, anything else wraps above 7
    ok = (head <= 7).all(axis=1) & (fields[:, digits] == 0)
    values = (head.astype(np.float64) @ _DIGIT_WEIGHTS[digits]).astype(np.int64)
    if not ok.all():
        unusual = ~ok
        values[unusual], ok[unusual] = _octal_fields_general(fields[unusual])
    return values, ok


def _octal_fields_general(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`octal_fields` for any layout: each digit is shifted by three bits per digit that follows it."""
    chars = fields.T.astype(np.int64)  # one row per character position: numpy runs along the headers
    before_nul = np.logical_and.accumulate(chars != 0, axis=0)
    digit = before_nul & (chars >= 48) & (chars <= 55)
    stray = before_nul & ~digit & ~np.isin(chars, _WHITESPACE)
    run_starts = digit.copy()
    run_starts[1:] &= ~digit[:-1]
    ok = ~stray.any(axis=0) & (run_starts.sum(axis=0) == 1)
    following = np.cumsum(digit[::-1], axis=0)[::-1] - digit
    values = (np.where(digit, chars - 48, 0) << (3 * following)).sum(axis=0)
    return values, ok


def unsigned_checksums(headers: np.ndarray) -> np.ndarray:
    """Each header's checksum as tar writers compute it: its byte sum, the checksum field as spaces.

    Each half of a header is summed in 16 bits (256 bytes of at most 255 cannot overflow them), which
    numpy does faster than a sum in wider integers.
    """
    halves = headers.reshape(len(headers), 2, BLOCK // 2).sum(axis=2, dtype=np.uint16)
    halves[:, 0] -= headers[:, CHECKSUM_FIELD].sum(axis=1, dtype=np.uint16)
    return halves[:, 0].astype(np.int64) + halves[:, 1] + 8 * 0x20


def signed_checksums(headers: np.ndarray, unsigned: np.ndarray) -> np.ndarray:
    """The checksums some old tars wrote, summing bytes as signed: `unsigned` less 256 per byte above 127."""
    return unsigned - 256 * (headers[:, _OUTSIDE_CHECKSUM] > 127).sum(axis=1)


def stored_checksums(headers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of each header's checksum field, as `octal_fields` reads it."""
    return octal_fields(headers[:, CHECKSUM_FIELD])
