"""Header numbers and checksums read exactly as Python's tarfile reads them, for any bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


def _tarfile_number(field: bytes) -> int | None:
    """A numeric header field as Python's tarfile reads it (base-256 included), None where it refuses it."""
    import tarfile

    try:
        return tarfile.nti(field)
    except tarfile.HeaderError:
        return None


def _written_field(value: int, width: int, leading_spaces: int, tail: bytes) -> bytes:
    """A numeric field the way some tar writer lays it out: optional leading spaces, the octal digits
    (zero-filled to the width), then a terminator of spaces and NULs."""
    digits = width - len(tail) - leading_spaces
    return b" " * leading_spaces + f"{value:0{digits}o}".encode() + tail


numeric_fields = st.builds(
    lambda width, leading, tail, fraction: (width, leading, tail, fraction),
    st.sampled_from([8, 12]),
    st.integers(0, 4),
    st.sampled_from([b"\0", b" ", b" \0", b"\0 ", b"\0\0", b"  "]),
    st.floats(0, 1),
).map(
    lambda spec: _written_field(
        int(spec[3] * (8 ** (spec[0] - len(spec[2]) - spec[1]) - 1)), spec[0], spec[1], spec[2]
    )
)


@given(st.lists(numeric_fields, min_size=1, max_size=20), st.sampled_from([8, 12]))
@settings(max_examples=500, deadline=None)
def test_octal_fields_read_every_writers_layout_as_tarfile_does(fields: list[bytes], width: int) -> None:
    """Usual 11/6-digit fields and the older space-padded ones, mixed in one batch, read as tarfile reads
    them (the batch takes the usual-layout product for some rows and the general rule for others)."""
    import numpy as np

    from prep.tar.header import octal_fields

    fields = [field for field in fields if len(field) == width] or [b"0" * (width - 1) + b"\0"]
    values, ok = octal_fields(np.frombuffer(b"".join(fields), dtype=np.uint8).reshape(len(fields), width))
    assert ok.all()
    assert values.tolist() == [_tarfile_number(field) for field in fields]


@given(
    st.lists(st.binary(min_size=12, max_size=12), min_size=1, max_size=10).map(
        lambda fs: [bytes(b"0123456 \0\t_+-o\x80\xff"[byte % 15] for byte in field) for field in fs]
    )
)
@settings(max_examples=1000, deadline=None)
def test_octal_fields_never_accept_a_field_tarfile_reads_differently(fields: list[bytes]) -> None:
    """Any field the parser calls ok is read to tarfile's value; base-256 numbers, fields without digits
    and fields tarfile refuses are not ok (verify walks or reports those, the scan re-checks them)."""
    import numpy as np

    from prep.tar.header import octal_fields

    for width in (8, 12):
        cut = [field[:width] for field in fields]
        values, ok = octal_fields(np.frombuffer(b"".join(cut), dtype=np.uint8).reshape(len(cut), width))
        for field, value, field_ok in zip(cut, values.tolist(), ok.tolist(), strict=True):
            expected = _tarfile_number(field)
            text = field.split(b"\0", 1)[0]
            if field_ok:
                assert value == expected, field
            if field[0] & 0x80 or not any(48 <= byte <= 55 for byte in text) or expected is None:
                assert not field_ok, field
            elif text.strip().isdigit() and b"8" not in text and b"9" not in text:
                assert field_ok, field


def test_base256_sizes_are_not_read_as_octal() -> None:
    import numpy as np

    from prep.tar.header import octal_fields

    fields = [b"\x80" + (8**11 + 5).to_bytes(11, "big"), b"\xff" * 12]
    values, ok = octal_fields(np.frombuffer(b"".join(fields), dtype=np.uint8).reshape(2, 12))
    assert [_tarfile_number(field) for field in fields] == [8**11 + 5, -1]
    assert not ok.any()


@given(st.lists(st.binary(min_size=512, max_size=512), min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_checksum_sums_agree_with_tarfile_on_any_bytes(headers: list[bytes]) -> None:
    import tarfile

    import numpy as np

    from prep.tar.header import signed_checksums, unsigned_checksums

    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), 512)
    unsigned = unsigned_checksums(rows)
    assert unsigned.tolist() == [tarfile.calc_chksums(header)[0] for header in headers]
    assert signed_checksums(rows, unsigned).tolist() == [
        tarfile.calc_chksums(header)[1] for header in headers
    ]


def test_checksum_sums_do_not_overflow_on_a_header_of_high_bytes() -> None:
    import tarfile

    import numpy as np

    from prep.tar.header import unsigned_checksums

    header = b"\xff" * 512
    assert unsigned_checksums(np.frombuffer(header, dtype=np.uint8).reshape(1, 512)).tolist() == [
        tarfile.calc_chksums(header)[0]
    ]


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=90), st.integers(0, 8**11 - 1), st.sampled_from([b"0", b"5", b"2"])
        ),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_tarfile_written_headers_pass_the_checksum_check(
    members: list[tuple[str, int, bytes]], signed: bool
) -> None:
    """The one checksum rule (the scan's, `check_not_compressed`'s and verify's) accepts what tarfile
    writes, the historic signed sum included, as tarfile does; and refuses a header with one byte changed."""
    import tarfile

    import numpy as np

    from prep.inspect.verify import _checksums_ok
    from prep.tar.header import checksum_ok, checksums_match

    headers = []
    for name, size, kind in members:
        info = tarfile.TarInfo(name)
        info.size, info.type = size, kind
        header = (
            info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")[:512]
            if len(name.encode()) < 100
            else None
        )
        if header is None:
            continue
        if signed and tarfile.calc_chksums(header)[1] >= 0:  # six octal digits hold no minus sign
            header = header[:148] + b"%06o\0 " % tarfile.calc_chksums(header)[1] + header[156:]
        headers.append(header)
    if not headers:
        return
    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), 512)
    assert all(tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape") for header in headers)
    assert all(checksum_ok(header) for header in headers)
    assert checksums_match(rows).all()
    assert _checksums_ok(rows, np.arange(len(headers)) * 512).all()
    assert not _checksums_ok(rows, np.arange(len(headers)) * 512 + 1).any()  # not on a block boundary
    damaged = rows.copy()
    damaged[:, 0] ^= 0x01  # the name's first byte: the sum changes by one
    assert not checksums_match(damaged).any()


def test_a_base256_checksum_field_is_read_as_tarfile_reads_it() -> None:
    import tarfile

    from prep.tar.header import checksum_ok

    header = bytearray(tarfile.TarInfo("a.txt").tobuf(tarfile.USTAR_FORMAT)[:512])
    unsigned = tarfile.calc_chksums(bytes(header))[0]
    header[148:156] = b"\x80" + unsigned.to_bytes(7, "big")
    assert tarfile.TarInfo.frombuf(bytes(header), "utf-8", "surrogateescape").chksum == unsigned
    assert checksum_ok(bytes(header))
