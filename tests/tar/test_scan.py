"""The header scan: the vectorised path and the header-by-header walk agree on every writer's tars."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st


def test_vectorised_scan_agrees_with_the_header_walk(tmp_path: Path) -> None:
    """Both ways through a shard give the same members, offsets and end, on every writer's output."""
    import tarfile

    from prep.tar.scan import HeaderWalker, decoded_names, open_shard
    from tests.support.shards import (
        sample_members,
        tricky_members,
        write_gnu_tar,
        write_tarfile,
        write_webdataset,
    )

    shards = [
        write_tarfile(tmp_path / "pax.tar", tricky_members("p/") + sample_members("a", 20), non_regular=True),
        write_tarfile(tmp_path / "gnu.tar", sample_members("b", 20), tarfile.GNU_FORMAT, non_regular=True),
        write_tarfile(tmp_path / "ustar.tar", sample_members("c", 20), tarfile.USTAR_FORMAT),
        write_webdataset(tmp_path / "wds.tar", [{"__key__": f"k{i}", "txt": "x" * i} for i in range(30)]),
        write_gnu_tar(tmp_path / "gnutar.tar", sample_members("d", 20), "gnu"),
        write_gnu_tar(tmp_path / "gnupax.tar", tricky_members("e/"), "pax"),
    ]
    taken = 0
    for shard in shards:
        buffer = open_shard(str(shard), shard.name)
        fast, walk = HeaderWalker(shard.name, buffer), HeaderWalker(shard.name, buffer)
        vectorised = fast._scan_vectorised()
        walked = walk._walk()
        if vectorised is not None:
            taken += 1
            assert (decoded_names(vectorised[0]), *vectorised[1:]) == walked, shard.name
            assert (fast.end, list(fast.header_offsets)) == (walk.end, list(walk.header_offsets)), shard.name
    assert taken >= 3  # long names and long links (PAX path, GNU K) take the walk


@given(
    st.lists(
        st.tuples(st.text(max_size=30).filter(lambda t: "\0" not in t), st.binary(max_size=8)),
        min_size=1,
        max_size=20,
    )
)
@settings(max_examples=300, deadline=None)
def test_names_joined_at_once_are_each_name_up_to_its_first_nul(rows: list[tuple[str, bytes]]) -> None:
    """Both users of the one-decode join: header name fields (cut at the first NUL, whatever follows) and
    sample keys (NUL-padded, with each key's end in characters)."""
    import numpy as np

    from prep.index.group import _joined
    from prep.tar.scan import HeaderWalker, decoded_names

    texts = [text for text, _ in rows]
    width = max(len(text.encode()) + 1 + len(tail) for text, tail in rows)
    fields = np.array(
        [(text.encode() + b"\0" + tail).ljust(width, b"\0") for text, tail in rows], dtype=f"S{width}"
    )
    assert decoded_names(HeaderWalker._names(fields, None)) == texts
    joined, ends = _joined(np.array([text.encode() for text in texts]))
    assert joined == "".join(text + "\0" for text in texts)
    assert list(ends) == [at for at, character in enumerate(joined) if character == "\0"]


def test_a_cut_shard_walked_by_ranged_reads_is_not_read_again_for_the_error() -> None:
    """The walk keeps the headers it copied, so the error's search for an earlier corrupt header costs
    no request: a shard of big members cut inside its last one takes one read per header, not two."""
    import io
    import tarfile

    import pytest

    from prep.errors import ShardError
    from prep.storage.ranged import RangedObject
    from prep.tar.scan import RangedHeaderWalker

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number in range(50):
            info = tarfile.TarInfo(f"{number:04d}.bin")
            info.size = 300_000
            tar.addfile(info, io.BytesIO(bytes(info.size)))
    data = out.getvalue()[:-20_000]  # cut inside the last member
    shard = RangedObject(lambda offset, length: data[offset : offset + length], len(data), read_through=0)
    with pytest.raises(ShardError, match="cut short|ends|end"):
        RangedHeaderWalker("cut.tar", shard).scan()
    assert shard.requests <= 50 + 2


def test_a_size_field_of_twelve_octal_digits_is_read_whole() -> None:
    """bsdtar fills the 12-byte size field with 12 octal digits and no NUL for members of 8-64 GiB;
    tarfile and energon read all twelve. A walk that read eleven saw a wrong size and a corrupt header."""
    import io
    import tarfile

    from prep.tar.scan import HeaderWalker

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number, size in enumerate([100_000, 20_000, 20_000]):  # big members: the header walk
            info = tarfile.TarInfo(f"{number:04d}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    data = bytearray(out.getvalue())
    data[124:136] = b"%012o" % 100_000  # the first size field: "000000303240", not "00000303240\0"
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
    walked = [(m.name, m.offset_data, m.size) for m in HeaderWalker("big.tar", bytes(data)).members()]
    assert walked == expected and expected[0] == ("0000.bin", 512, 100_000)
