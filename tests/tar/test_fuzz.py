"""Fuzzing the tar scanner, the sample grouping and verify on real shards, mutated: whatever the bytes, they
return the members tarfile reads or raise the project's ShardError naming the shard (and an offset where
one applies); they never raise anything else, never hang, and never read a size field's claim into memory.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import PrepError, ShardError
from prep.index.group import shard_rows
from prep.inspect.verify import verify_dataset
from prep.prepare import prepare_dataset
from prep.tar.fields import BLOCK
from prep.tar.scan import HeaderWalker

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
#: More examples for a long local run: SHARDPREP_FUZZ_EXAMPLES=5000 pytest tests/tar/test_fuzz.py
SETTINGS = settings(
    max_examples=int(os.environ.get("SHARDPREP_FUZZ_EXAMPLES", "150")),
    deadline=2000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def real_shard(names: list[str], sizes: list[int], fmt: str) -> bytes:
    """A shard written by Python's tarfile: member i named names[i] with sizes[i] bytes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[fmt]) as tar:
        for number, (name, size) in enumerate(zip(names, sizes, strict=True)):
            info = tarfile.TarInfo(name)
            info.size = size
            info.mtime = 1_700_000_000
            if fmt == "pax" and number % 3 == 0:
                info.pax_headers = {"comment": "x" * number}
            tar.addfile(info, io.BytesIO(bytes([65 + number % 26]) * size))
    return out.getvalue()


member_names = st.lists(
    st.tuples(
        st.sampled_from(["a", "s0", "dir/s1", "p" * 120 + "/" + "k" * 90, "ü", "x.y"]),
        st.sampled_from(["txt", "json", "tar.gz", "cls"]),
    ),
    min_size=1,
    max_size=8,
)


@st.composite
def shards(draw: st.DrawFn) -> bytes:
    parts = draw(member_names)
    names = [f"{key}.{part}" for key, part in parts]
    sizes = draw(st.lists(st.integers(0, 1500), min_size=len(names), max_size=len(names)))
    return real_shard(names, sizes, draw(st.sampled_from(sorted(FORMATS))))


@st.composite
def mutated_shards(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(shards()))
    kind = draw(st.sampled_from(["flip", "cut", "splice", "size", "pax", "longname", "none"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        del data[draw(st.integers(0, len(data))) :]
    elif kind == "splice":
        source = draw(st.integers(0, len(data) // BLOCK - 1)) * BLOCK
        target = draw(st.integers(0, len(data) // BLOCK - 1)) * BLOCK
        data[target : target + BLOCK] = data[source : source + BLOCK]
    elif kind == "size":  # a header claiming an absurd size, with a checksum that matches
        data[124:136] = draw(st.sampled_from([b"77777777777\0", b"\x80" + b"\0" * 6 + b"\x01" + b"\0" * 4]))
        _fix_checksum(data, 0)
    elif kind == "pax":  # a PAX header whose record claims far more bytes than there are
        record = draw(st.sampled_from([b"2147483647 path=x\n", b"99999999999999999999 size=1\n", b"0 x=\n"]))
        data[:0] = _header(b"././@PaxHeader", len(record), b"x") + record.ljust(BLOCK, b"\0")
    elif kind == "longname":  # a GNU long name that no member follows
        name = b"n" * 200
        data[:] = _header(b"././@LongLink", len(name) + 1, b"L") + (name + b"\0").ljust(BLOCK, b"\0")
        data += bytes(2 * BLOCK) if draw(st.booleans()) else b""
    return bytes(data)


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    header = bytearray(BLOCK)
    header[0 : len(name)] = name
    header[100:108] = b"0000644\0"
    header[124:136] = f"{size:011o}\0".encode()
    header[136:148] = b"00000000000\0"
    header[156:157] = typeflag
    header[257:263] = b"ustar\0"
    header[263:265] = b"00"
    _fix_checksum(header, 0)
    return bytes(header)


def _fix_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = f"{sum(data[at : at + BLOCK]):06o}\0 ".encode()


def tarfile_members(data: bytes) -> list[tuple[str, int, int, int]] | None:
    """(name, offset, data offset, size) of each regular member as tarfile reads them, or None unless
    tarfile reads the whole archive cleanly: every member's data there, and it stops at the end-of-archive
    marker or exactly at the end of the file (tarfile silently stops at a cut header; we refuse that)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = tar.getmembers()
            for member in members:
                if member.isreg() and len(tar.extractfile(member).read()) != member.size:
                    return None
            end = tar.offset
    except Exception:  # tarfile's own errors, and the ones it lets through (OverflowError, ValueError)
        return None
    if end != len(data) and data[end : end + BLOCK] != bytes(BLOCK):
        return None
    return [(m.name, m.offset, m.offset_data, m.size) for m in members if m.isreg()]


def scan(data: bytes) -> list[tuple[str, int, int, int]]:
    names, starts, data_offsets, sizes = HeaderWalker("fuzz.tar", data).scan()
    return list(zip(names, starts, data_offsets, sizes, strict=True))


@SETTINGS
@given(data=mutated_shards())
def test_scanner_returns_what_tarfile_reads_or_raises_a_shard_error(data: bytes) -> None:
    try:
        walker = HeaderWalker("fuzz.tar", data)
        ours = scan(data)
        walker.verify_checksums()
    except ShardError as error:
        assert error.shard == "fuzz.tar" and str(error).startswith("fuzz.tar")
        return
    theirs = tarfile_members(data)
    if theirs is not None:
        assert [(name, size) for name, _, _, size in ours] == [(name, size) for name, _, _, size in theirs]
        assert [data_offset for _, _, data_offset, _ in ours] == [
            data_offset for _, _, data_offset, _ in theirs
        ]


@SETTINGS
@given(data=shards())
def test_on_shards_tarfile_wrote_the_scanner_agrees_with_tarfile_exactly(data: bytes) -> None:
    theirs = tarfile_members(data)
    assert theirs is not None
    assert [(name, data_offset, size) for name, _, data_offset, size in scan(data)] == [
        (name, data_offset, size) for name, _, data_offset, size in theirs
    ]


@SETTINGS
@given(data=mutated_shards())
def test_grouping_a_mutated_shard_gives_rows_or_a_shard_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.tar"
    path.write_bytes(data)
    try:
        rows = shard_rows(str(path), "fuzz.tar", 0)
    except ShardError as error:
        assert error.shard == "fuzz.tar"
        return
    assert len(rows.sample_starts) == rows.count and rows.end <= len(data)
    assert all(0 <= offset <= len(data) for offset in rows.part_offsets)


@pytest.mark.parametrize(
    "claim",
    [
        _header(b"huge.bin", 2**40, b"0"),  # a 1 TB member
        _header(b"././@PaxHeader", 2**31, b"x"),  # a 2 GB PAX record
        _header(b"././@LongLink", 2**31, b"L"),  # a 2 GB GNU long name
    ],
    ids=["1TB-member", "2GB-pax", "2GB-longname"],
)
def test_a_size_claim_is_checked_against_the_shard_not_allocated(claim: bytes) -> None:
    data = claim + bytes(4 * BLOCK)
    tracemalloc.start()
    try:
        with pytest.raises(ShardError, match="fuzz.tar at byte 0"):
            scan(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"scanning a 3 KB shard allocated {peak:,} bytes"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-verify") / "dataset"
    root.mkdir()
    for number in range(2):
        names = [f"s{number}{sample}.{part}" for sample in range(6) for part in ("txt", "json")]
        (root / f"shard-{number}.tar").write_bytes(
            real_shard(names, [40 * (i % 4) for i in range(12)], "pax")
        )
    prepare_dataset(root, sample_type="CrudeWebdataset")
    return root


@settings(SETTINGS, max_examples=max(20, SETTINGS.max_examples // 5))
@given(
    kind=st.sampled_from(["flip", "cut", "zero", "append"]),
    at=st.floats(0, 1),
    byte=st.integers(1, 255),
    deep=st.booleans(),
)
def test_verify_of_a_damaged_shard_reports_it_and_never_crashes(
    prepared, tmp_path_factory, kind, at, byte, deep
):
    root = tmp_path_factory.mktemp("damaged") / "dataset"
    shutil.copytree(prepared, root)
    shard = root / "shard-1.tar"
    data = bytearray(shard.read_bytes())
    position = int(at * (len(data) - 1))
    if kind == "flip":
        data[position] ^= byte
    elif kind == "cut":
        del data[position:]
    elif kind == "zero":
        data[position : position + BLOCK] = bytes(len(data[position : position + BLOCK]))
    else:
        data += bytes([byte]) * 10
    shard.write_bytes(bytes(data))
    try:
        report = verify_dataset(root, deep=deep)
    except PrepError as error:
        assert "shard-1.tar" in str(error)
        return
    assert all(problem.where and problem.what and problem.fix for problem in report.problems)
    if not report.healthy:
        assert any("shard-1.tar" in problem.where for problem in report.problems), report.problems


def _member(name: bytes, data: bytes) -> bytes:
    return _header(name, len(data), b"0") + data.ljust(-(-len(data) // BLOCK) * BLOCK, b"\0")


def _extension(typeflag: bytes, payload: bytes, size: int | None = None) -> bytes:
    name = b"././@LongLink" if typeflag == b"L" else b"././@PaxHeader"
    size = len(payload) if size is None else size
    return _header(name, size, typeflag) + payload.ljust(-(-len(payload) // BLOCK) * BLOCK, b"\0")


@pytest.mark.parametrize(
    "chain",
    [
        [_extension(b"L", b"long-first.txt\0"), _extension(b"x", b"23 path=pax-second.txt\n")],
        [_extension(b"x", b"22 path=pax-first.txt\n"), _extension(b"L", b"long-second.txt\0")],
        [_extension(b"L", b"first.txt\0"), _extension(b"L", b"second.txt\0")],
        [_extension(b"x", b"18 path=first.txt\n"), _extension(b"x", b"19 path=second.txt\n")],
        [_extension(b"x", b"15 comment=xxx\n23 path=in-padding.txt\n", size=15)],  # records past the size
    ],
    ids=["long-then-pax", "pax-then-long", "two-long-names", "two-pax", "pax-records-past-size"],
)
def test_chains_of_extended_headers_name_the_member_as_tarfile_does(chain: list[bytes]) -> None:
    data = b"".join(chain) + _member(b"short.txt", b"x") + bytes(2 * BLOCK)
    theirs = tarfile_members(data)
    assert theirs is not None
    assert [(name, data_offset, size) for name, _, data_offset, size in scan(data)] == [
        (name, data_offset, size) for name, _, data_offset, size in theirs
    ]
