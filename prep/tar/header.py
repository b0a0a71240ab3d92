"""Read a tar header's numbers, checksum and PAX records, as Python's `tarfile` reads them.

A header stores numbers as octal text (or, for big values, GNU base-256) and a checksum: the sum of its
512 bytes with the checksum field itself counted as eight spaces (some old writers summed the bytes as
signed). `number` reads one field; `octal_fields` reads one field of thousands of headers at once, each
header a row of a 2-D uint8 array, to the same values wherever it calls them ok. `checksums_match` is
the one checksum rule, for one header or thousands: the scan, `check_not_compressed` and verify use it.
"""

from __future__ import annotations

import numpy as np

from prep.tar.fields import BLOCK, CHECKSUM, MAGIC, NAME, PREFIX, SIZE, USTAR

#: The byte after "ustar" in the magic: NUL (POSIX) or a space (GNU); both have the prefix field here.
USTAR_ENDINGS = (0, 0x20)
_OUTSIDE_CHECKSUM = np.r_[0 : CHECKSUM.start, CHECKSUM.stop : BLOCK]
_CHECKSUM_AS_SPACES = 8 * 0x20
#: How tar writers fill a numeric field of each width: that many octal digits, then a NUL.
_USUAL_DIGITS = {12: 11, 8: 6}
# float64 so the product runs in BLAS: exact, as 11 octal digits are 33 bits.
_DIGIT_WEIGHTS = {digits: 8.0 ** np.arange(digits - 1, -1, -1) for digits in _USUAL_DIGITS.values()}
#: What `str.strip` removes around the digits, as tarfile reads a field.
_WHITESPACE = np.frombuffer(b" \t\n\v\f\r\x1c\x1d\x1e\x1f", dtype=np.uint8)


def number(field: bytes) -> int:
    """A numeric header field: octal text up to the first NUL, or GNU base-256 for large values.

    ValueError if it is neither.

    >>> number(b"00000000017\\0"), number(b"     17     "), number(b"\\x80" + (8**11).to_bytes(11, "big"))
    (15, 15, 8589934592)
    """
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative base-256
            value -= 1 << (8 * (len(field) - 1))
        return value
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def octal_fields(fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of one numeric field per row: `number` for the rows that are ok.

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
    halves[:, 0] -= headers[:, CHECKSUM].sum(axis=1, dtype=np.uint16)
    return halves[:, 0].astype(np.int64) + halves[:, 1] + _CHECKSUM_AS_SPACES


def signed_checksums(headers: np.ndarray, unsigned: np.ndarray) -> np.ndarray:
    """The checksums some old tars wrote, summing bytes as signed: `unsigned` less 256 per byte above 127."""
    return unsigned - 256 * (headers[:, _OUTSIDE_CHECKSUM] > 127).sum(axis=1)


def checksums_match(headers: np.ndarray) -> np.ndarray:
    """For each header (a row of 512 bytes), whether its stored checksum is the unsigned or the signed
    sum of its bytes, as tarfile accepts either."""
    unsigned = unsigned_checksums(headers)
    stored, parsed = octal_fields(headers[:, CHECKSUM])
    for row in np.flatnonzero(~parsed).tolist():  # rare: base-256, or not a number (then not a match)
        try:
            stored[row], parsed[row] = number(headers[row, CHECKSUM].tobytes()), True
        except ValueError:
            pass
    ok = parsed & (stored == unsigned)
    retry = np.flatnonzero(parsed & ~ok)  # some old tars sum signed bytes
    if retry.size:
        ok[retry] = stored[retry] == signed_checksums(headers[retry], unsigned[retry])
    return ok


def checksum_ok(header: bytes) -> bool:
    """Whether one 512-byte header's stored checksum matches (`checksums_match` for a single header)."""
    if len(header) != BLOCK:
        return False
    return bool(checksums_match(np.frombuffer(header, dtype=np.uint8).reshape(1, BLOCK))[0])


def header_path(block: bytes) -> tuple[bytes, bool]:
    """(the name a header's fields hold, whether it is a ustar header with a prefix field).

    The name field ends at its first NUL; in a ustar header a non-empty prefix field goes in front,
    joined by a slash (alone if the name field is empty).
    """
    name = block[NAME].split(b"\0", 1)[0]
    magic = block[MAGIC]
    if not (magic.startswith(USTAR) and magic[len(USTAR)] in USTAR_ENDINGS):
        return name, False
    prefix = block[PREFIX].split(b"\0", 1)[0]
    if prefix and name:
        return prefix + b"/" + name, True
    return (prefix or name), True


def header_member(header: bytes) -> tuple[bytes, int] | None:
    """(name, size) that one 512-byte header gives its member (`header_path`), or
    None when the block is not a valid header (its checksum does not match, or its size is no number).

    Only the header's own fields: a PAX or GNU long name before it is not seen (its name field then
    holds the name cut at 100 bytes).

    >>> import tarfile
    >>> info = tarfile.TarInfo("a/b.txt"); info.size = 5
    >>> header_member(info.tobuf()), header_member(bytes(BLOCK))
    ((b'a/b.txt', 5), None)
    """
    if not checksum_ok(header) or not any(header):
        return None
    try:
        size = number(header[SIZE])
    except ValueError:
        return None
    return header_path(header)[0], size


def parse_pax(data: bytes) -> dict[str, str]:
    """The records of a PAX header's data: `"%d %s=%s\\n"`, the length counting the whole record.

    ValueError for a malformed record, UnicodeDecodeError for one that is not UTF-8.

    >>> parse_pax(b"18 path=dir/a.jpg\\n9 size=9\\n")
    {'path': 'dir/a.jpg', 'size': '9'}
    """
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            break
        length = int(data[pos:space])
        if length <= 0:
            raise ValueError("a PAX record of length 0")
        if pos + length > len(data) or data[pos + length - 1] != 0x0A:
            raise ValueError(
                f"a PAX record claims {length} bytes, which do not end in a newline inside the header"
            )
        record = data[space + 1 : pos + length - 1]
        keyword, eq, value = record.partition(b"=")
        if not eq:
            raise ValueError("a PAX record without '='")
        records[keyword.decode("utf-8")] = value.decode("utf-8")
        pos += length
    return records
