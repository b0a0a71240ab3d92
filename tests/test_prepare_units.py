"""The small pieces of prepare agree with energon 7.4.1's behaviour, checked against energon itself."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.brace import collapse, expand
from prep.index_format import SAMPLE_NAME_RE, SKIP_META_RE, split_member_name, tar_index_name
from prep.shard_list import find_shards
from prep.split import split_by_ratio
from tests.prepare_support import REPO

shard_names = st.lists(
    st.builds(
        lambda folder, stem, number, width, tail: f"{folder}{stem}{number:0{width}d}{tail}.tar",
        st.sampled_from(["", "a/", "b.c/", "p_01/"]),
        st.sampled_from(["shard-", "s", "x2-"]),
        st.integers(0, 30),
        st.integers(1, 4),
        st.sampled_from(["", "-0", "-1"]),
    ),
    max_size=40,
)


@given(shard_names)
@settings(max_examples=300, deadline=None)
def test_collapse_expands_back_to_the_same_list(names: list[str]) -> None:
    assert expand(collapse(names)) == names


@given(shard_names)
@settings(max_examples=300, deadline=None)
def test_collapse_writes_energons_text_where_energons_is_right(names: list[str]) -> None:
    from megatron.energon.bracecollapse import collapse as energon_collapse

    theirs = energon_collapse(names, keep_order=True)
    if expand(theirs) == names:  # energon merges '00' with '000' at times, which loses shards
        assert collapse(names) == theirs


@given(st.text(alphabet="ab._/_-", max_size=12))
@settings(max_examples=2000, deadline=None)
def test_member_names_split_exactly_as_energons_regex(name: str) -> None:
    expected = None
    if not SKIP_META_RE.match(name):
        match = SAMPLE_NAME_RE.match(name)
        expected = (match.group(1), match.group(2)) if match else None
    assert split_member_name(name) == expected


def energon_ratio_split(shards: list[str], ratio: list[float], shuffle: bool) -> dict[str, list[str]]:
    """energon's own arithmetic, restated from its prepare: normalise, optionally shuffle, cut cumulatively."""
    total = sum(ratio)
    order = list(shards)
    if shuffle:
        random.Random(42).shuffle(order)
    out, cumulative, start = {}, 0.0, 0
    for name, value in zip(("train", "val", "test"), ratio, strict=True):
        cumulative += value / total
        end = int(len(order) * cumulative)
        out[name], start = order[start:end], end
    return out


@given(st.integers(0, 60), st.lists(st.floats(0, 10), min_size=3, max_size=3).filter(lambda r: sum(r) > 0), st.booleans())
@settings(max_examples=300, deadline=None)
def test_ratio_split_cuts_whole_shards_like_energon(count: int, ratio: list[float], shuffle: bool) -> None:
    shards = [f"{i:04d}.tar" for i in range(count)]
    ours = split_by_ratio(shards, list(zip(("train", "val", "test"), ratio, strict=True)), 42 if shuffle else None)
    assert ours == energon_ratio_split(shards, ratio, shuffle)


def test_shard_discovery_matches_energons_glob_and_order(tmp_path: Path) -> None:
    from megatron.energon.epathlib import EPath

    for name in ["a.tar", "a-b.tar", "a/b.tar", "sub/deep/c.tar", "x.tgz", ".hidden/d.tar", ".e.tar", "X.TAR", "n.tar.gz"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "f.tar").write_bytes(b"")
    (tmp_path / "link").symlink_to("target")
    root = EPath(tmp_path)
    found = list(root.glob("**/*.tar")) + list(root.glob("**/*.tgz"))
    theirs = [p.relative_to(root) for p in sorted(found)]
    assert find_shards(tmp_path) == theirs


def test_tar_index_file_names_follow_energon() -> None:
    assert tar_index_name("a/shard.tar") == "a/shard.tar.idx"
    assert tar_index_name("a/shard.tgz") == "a/shard.tar.idx"
    assert tar_index_name("v1.2/s.tar") == "v1.2/s.tar.idx"


def test_sample_type_table_matches_installed_energon() -> None:
    import megatron.energon

    from prep.sample_types_data import ENERGON_VERSION, SAMPLE_TYPES
    from tools.energon_sample_types import energon_sample_types

    assert ENERGON_VERSION == megatron.energon.__version__
    assert [list(map(tuple, fields)) for _, fields in SAMPLE_TYPES] == [
        [tuple(f) for f in fields] for _, fields in energon_sample_types()
    ]
    assert [name for name, _ in SAMPLE_TYPES] == [name for name, _ in energon_sample_types()]


def test_command_line_imports_neither_torch_nor_energon() -> None:
    code = (
        "import sys, prep.cli, prep.prepare, prep.prepare_cli;"
        "from prep.cli import main;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0


def test_help_lists_prepare() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "prep", "--help"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0 and "prepare" in result.stdout


def test_vectorised_scan_agrees_with_the_header_walk(tmp_path: Path) -> None:
    """Both ways through a shard give the same members, offsets and end, on every writer's output."""
    import tarfile

    from prep.tar_scan import HeaderWalker, open_shard
    from tests.shard_makers import (
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
            assert vectorised == walked, shard.name
            assert (fast.end, list(fast.header_offsets)) == (walk.end, list(walk.header_offsets)), shard.name
    assert taken >= 3  # long names and long links (PAX path, GNU K) take the walk


@pytest.mark.parametrize("prefix", ["a.b/x", "dü€𝄞.x/ké"])
def test_vectorised_grouping_agrees_with_member_by_member_grouping(tmp_path: Path, prefix: str) -> None:
    from prep.shard_index import ShardRows, _group_one_by_one, _group_vectorised
    from prep.tar_scan import HeaderWalker, open_shard
    from tests.shard_makers import sample_members, write_tarfile

    members = sample_members(prefix, 30, {"jpg": b"j%d", "ség.0.txt": b"t%d", "json": b"{}"})
    shard = write_tarfile(tmp_path / "s.tar", members)
    walker = HeaderWalker("s.tar", open_shard(str(shard), "s.tar"))
    scanned = walker.scan()
    vectorised, one_by_one = ShardRows("s.tar", 3, end=walker.end), ShardRows("s.tar", 3, end=walker.end)
    _group_one_by_one(one_by_one, *scanned)
    assert _group_vectorised(vectorised, *scanned)  # empties the names list
    assert vectorised.to_index() == one_by_one.to_index()
    assert vectorised.count == 30 and len(vectorised.to_index().parts) == 90
    assert vectorised.sample_keys[0] == f"{prefix}00000" and vectorised.keys_between(29, 30) == [f"{prefix}00029"]


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

    from prep.tar_header import octal_fields

    fields = [field for field in fields if len(field) == width] or [b"0" * (width - 1) + b"\0"]
    values, ok = octal_fields(np.frombuffer(b"".join(fields), dtype=np.uint8).reshape(len(fields), width))
    assert ok.all()
    assert values.tolist() == [_tarfile_number(field) for field in fields]


@given(st.lists(st.binary(min_size=12, max_size=12), min_size=1, max_size=10).map(lambda fs: [
    bytes(b"0123456 \0\t_+-o\x80\xff"[byte % 15] for byte in field) for field in fs
]))
@settings(max_examples=1000, deadline=None)
def test_octal_fields_never_accept_a_field_tarfile_reads_differently(fields: list[bytes]) -> None:
    """Any field the parser calls ok is read to tarfile's value; base-256 numbers, fields without digits
    and fields tarfile refuses are not ok (verify walks or reports those, the scan re-checks them)."""
    import numpy as np

    from prep.tar_header import octal_fields

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

    from prep.tar_header import octal_fields

    fields = [b"\x80" + (8**11 + 5).to_bytes(11, "big"), b"\xff" * 12]
    values, ok = octal_fields(np.frombuffer(b"".join(fields), dtype=np.uint8).reshape(2, 12))
    assert [_tarfile_number(field) for field in fields] == [8**11 + 5, -1]
    assert not ok.any()


@given(st.lists(st.binary(min_size=512, max_size=512), min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_checksum_sums_agree_with_tarfile_on_any_bytes(headers: list[bytes]) -> None:
    import tarfile

    import numpy as np

    from prep.tar_header import signed_checksums, unsigned_checksums

    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), 512)
    unsigned = unsigned_checksums(rows)
    assert unsigned.tolist() == [tarfile.calc_chksums(header)[0] for header in headers]
    assert signed_checksums(rows, unsigned).tolist() == [tarfile.calc_chksums(header)[1] for header in headers]


def test_checksum_sums_do_not_overflow_on_a_header_of_high_bytes() -> None:
    import tarfile

    import numpy as np

    from prep.tar_header import unsigned_checksums

    header = b"\xff" * 512
    assert unsigned_checksums(np.frombuffer(header, dtype=np.uint8).reshape(1, 512)).tolist() == [
        tarfile.calc_chksums(header)[0]
    ]


@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=90), st.integers(0, 8**11 - 1), st.sampled_from([b"0", b"5", b"2"])),
        min_size=1,
        max_size=12,
    ),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_tarfile_written_headers_pass_both_checksum_checks(members: list[tuple[str, int, bytes]], signed: bool) -> None:
    """The scan's quick test and verify's check accept what tarfile writes, and verify also the historic
    signed sum (as tarfile does), which the scan leaves to its exact re-check."""
    import tarfile

    import numpy as np

    from prep.tar_scan import _checksums_differ, header_checksum_ok
    from prep.verify import _checksums_ok

    headers = []
    for name, size, kind in members:
        info = tarfile.TarInfo(name)
        info.size, info.type = size, kind
        header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")[:512] if len(name.encode()) < 100 else None
        if header is None:
            continue
        if signed and tarfile.calc_chksums(header)[1] >= 0:  # six octal digits hold no minus sign
            header = header[:148] + b"%06o\0 " % tarfile.calc_chksums(header)[1] + header[156:]
        headers.append(header)
    if not headers:
        return
    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), 512)
    assert all(tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape") for header in headers)
    assert all(header_checksum_ok(header) for header in headers)
    assert _checksums_ok(rows, np.arange(len(headers)) * 512).all()
    differ = _checksums_differ(rows)
    # where a header holds the signed sum and it differs from the unsigned one, the quick test flags it
    assert differ.tolist() == [tarfile.nti(h[148:156]) != tarfile.calc_chksums(h)[0] for h in headers]


@given(st.lists(st.tuples(st.text(max_size=30).filter(lambda t: "\0" not in t), st.binary(max_size=8)), min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_names_joined_at_once_are_each_name_up_to_its_first_nul(rows: list[tuple[str, bytes]]) -> None:
    """Both users of the one-decode join: header name fields (cut at the first NUL, whatever follows) and
    sample keys (NUL-padded, with each key's end in characters)."""
    import numpy as np

    from prep.shard_index import _joined
    from prep.tar_scan import HeaderWalker

    texts = [text for text, _ in rows]
    width = max(len(text.encode()) + 1 + len(tail) for text, tail in rows)
    fields = np.array([(text.encode() + b"\0" + tail).ljust(width, b"\0") for text, tail in rows], dtype=f"S{width}")
    assert HeaderWalker._names(fields, None) == texts
    joined, ends = _joined(np.array([text.encode() for text in texts]))
    assert joined == "".join(text + "\0" for text in texts)
    assert list(ends) == [at for at, character in enumerate(joined) if character == "\0"]
