"""`shardprep prepare --fix-duplicates` renames members exactly as `energon prepare --fix-duplicates` 7.4.1
does, journaled: an interruption is finished by the next run, and what cannot be renamed is left alone."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from prep.prepare.fix_duplicates import FIX_FOLDER, JOURNAL_SUFFIX, PLAN, shard_prefix, write_journal
from prep.tar.header import header_path
from prep.tar.patch import prefixed_block, prefixed_blocks, renameable_headers, with_checksums
from tests.support.prepare import (
    REPO,
    assert_same_index,
    run_energon,
    run_shardprep,
    snapshot,
    tar_indexes,
    twin,
)
from tests.support.shards import sample_members, write_gnu_tar, write_tarfile, write_webdataset

FLAGS = ("--non-interactive", "--split-ratio", "8,1,1", "--no-progress")
#: A folder name that fits a header's name field, but not once a shard path is put in front.
NEAR_LIMIT = "d" * 88 + "/"


def energon_prepare(path: Path, *flags: str) -> subprocess.CompletedProcess:
    """`energon prepare PATH FLAGS`, however it ends (it fails on some of these datasets)."""
    return run_energon("prepare", str(path), *flags, check=False)


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.tar"))}


def write_duplicated_dataset(root: Path) -> None:
    """The same keys in shards from every writer: tarfile's ustar, GNU and PAX formats, webdataset's
    TarWriter (PAX headers with a float mtime), GNU tar's gnu, pax and ustar formats (the latter with names
    split into ustar's prefix field), names that need the prefix field once renamed, and a folder and a
    link between the members."""
    write_tarfile(
        root / "tf" / "ustar.tar", sample_members("", 4) + sample_members(NEAR_LIMIT, 2), tarfile.USTAR_FORMAT
    )
    write_tarfile(
        root / "tf" / "gnu.tar", sample_members("", 4) + sample_members(NEAR_LIMIT, 2), tarfile.GNU_FORMAT
    )
    write_tarfile(root / "tf" / "pax.tar", sample_members("", 5), tarfile.PAX_FORMAT)
    with tarfile.open(root / "tf" / "special.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sample_members("", 2):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for kind, name, link in ((tarfile.DIRTYPE, "folder", ""), (tarfile.SYMTYPE, "link.txt", "00000.txt")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            tar.addfile(info)
    write_webdataset(
        root / "wds" / "shard-0.tar",
        [{"__key__": f"{i:05d}", "txt": f"web {i}", "json": b"{}"} for i in range(4)],
    )
    write_gnu_tar(root / "gnu" / "gnu.tar", sample_members("", 4) + sample_members(NEAR_LIMIT, 2), "gnu")
    write_gnu_tar(root / "gnu" / "pax.tar", sample_members("", 3), "pax")  # a PAX header per member
    write_gnu_tar(
        root / "gnu" / "ustar.tar", sample_members("", 3) + sample_members("u" * 120 + "/", 2), "ustar"
    )


def test_renamed_shards_and_index_equal_energons(tmp_path: Path) -> None:
    pytest.importorskip("numba", reason="energon's --fix-duplicates needs its tar-patcher extra (numba)")
    ours = tmp_path / "dataset"
    write_duplicated_dataset(ours)
    theirs = twin(ours, "energon")
    result = run_shardprep("prepare", str(ours), *FLAGS, "--fix-duplicates", check=True)
    assert "The dataset contains duplicate keys" in result.stdout
    assert "[8/8] wds/shard-0.tar: 4 keys now start with 'wds/shard-0.tar/'" in result.stdout
    assert "Duplicate keys fixed successfully" in result.stdout
    fixed = energon_prepare(theirs, *FLAGS, "--fix-duplicates")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert shard_bytes(ours) == shard_bytes(theirs)
    assert_same_index(ours, theirs, dataset_yaml=None)
    assert not (ours / FIX_FOLDER).exists()
    # Fixed once: a second run finds nothing to do, as energon's does.
    again = run_shardprep("prepare", str(ours), *FLAGS, "--force-overwrite", "--fix-duplicates", check=True)
    assert "No duplicate keys found, continuing." in again.stdout
    assert shard_bytes(ours) == shard_bytes(theirs)


def test_shards_whose_path_is_wider_than_a_name_field_are_renamed_as_energon_renames_them(
    tmp_path: Path,
) -> None:
    """A shard path of over 100 bytes: every renamed name goes into ustar's prefix and name fields (the
    vectorised path has no row to rename; it ended in numpy's broadcast error)."""
    pytest.importorskip("numba", reason="energon's --fix-duplicates needs its tar-patcher extra (numba)")
    ours = tmp_path / "dataset"
    folder = ours / ("q" * 60) / ("r" * 60)
    for number in range(2):
        write_tarfile(folder / f"{number}.tar", sample_members("", 3), tarfile.USTAR_FORMAT)
    theirs = twin(ours, "energon")
    run_shardprep("prepare", str(ours), *FLAGS, "--crude", "--fix-duplicates", check=True)
    fixed = energon_prepare(theirs, *FLAGS, "--sample-type", "CrudeWebdataset", "--fix-duplicates")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert shard_bytes(ours) == shard_bytes(theirs)
    assert_same_index(ours, theirs)


def test_energon_loads_the_fixed_dataset_with_every_sample_once(tmp_path: Path) -> None:
    energon = pytest.importorskip("megatron.energon")
    for number in range(3):
        write_tarfile(
            tmp_path / f"{number}.tar", [(f"{i:03d}.txt", f"{number}-{i}".encode()) for i in range(5)]
        )
    flags = ("--sample-type", "TextSample", "--field-map", '{"text": "txt"}', "--fix-duplicates")
    run_shardprep(
        "prepare",
        str(tmp_path),
        "--non-interactive",
        "--no-progress",
        "--split-ratio",
        "1,0,0",
        *flags,
        check=True,
    )
    worker_config = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_val_dataset(
        tmp_path, split_part="train", worker_config=worker_config, batch_size=None
    )
    loaded = [(sample.__key__, sample.text) for sample in energon.get_loader(dataset)]
    expected = [(f"{number}.tar/{i:03d}", f"{number}-{i}") for number in range(3) for i in range(5)]
    assert sorted(loaded) == expected


def test_no_duplicates_leaves_every_shard_untouched(tmp_path: Path) -> None:
    for number in range(3):
        write_tarfile(tmp_path / f"{number}.tar", sample_members(f"s{number}-", 3))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(tmp_path.glob("*.tar"))}
    result = run_shardprep("prepare", str(tmp_path), *FLAGS, "--fix-duplicates", check=True)
    assert "No duplicate keys found, continuing." in result.stdout
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(tmp_path.glob("*.tar"))} == before
    assert tar_indexes(tmp_path)


@pytest.mark.parametrize(
    "write, problem",
    [
        (
            lambda path: write_tarfile(path, sample_members("e" * 120 + "/", 2)),
            "a PAX header there names the member",
        ),
        (lambda path: write_gnu_tar(path, sample_members("e" * 120 + "/", 2)), "GNU long name"),
        (
            lambda path: write_tarfile(
                path, sample_members("f" * 150 + "/" + "g" * 85 + "/", 2), tarfile.USTAR_FORMAT
            ),
            "fits no header name field",
        ),
        (
            lambda path: write_tarfile(path, sample_members("", 2) + sample_members("", 1)),
            "is there twice, apart",
        ),
        (
            lambda path: write_webdataset(
                path, [{"__key__": key, "txt": "t"} for key in [f"{i:05d}" for i in range(30)] + ["k" * 120]]
            ),
            "at byte 61440: a PAX header there names the member (path=...)",  # 30 members of 4 blocks
        ),
    ],
    ids=[
        "pax-path",
        "gnu-longname",
        "too-long-for-ustar",
        "key-apart-in-one-shard",
        "webdataset-one-long-name",
    ],
)
def test_what_cannot_be_renamed_is_refused_and_left_alone(tmp_path: Path, write, problem: str) -> None:
    for number in range(2):
        write(tmp_path / f"shard-{number}.tar")
    before = snapshot(tmp_path)
    result = run_shardprep("prepare", str(tmp_path), *FLAGS, "--fix-duplicates")
    assert result.returncode == 1
    assert problem in result.stderr and "shard-0.tar" in result.stderr and "shard-1.tar" in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(tmp_path) == before
    if problem.startswith("a PAX header"):  # energon says there are no duplicates, then fails on them
        check_energon_renames_nothing(tmp_path, before)


def check_energon_renames_nothing(tmp_path: Path, before: dict) -> None:
    theirs = energon_prepare(tmp_path, *FLAGS, "--fix-duplicates")
    assert theirs.returncode != 0
    assert {k: v for k, v in snapshot(tmp_path).items() if k.endswith(".tar")} == {
        k: v for k, v in before.items() if k.endswith(".tar")
    }


def test_read_only_shard_is_a_clear_error_and_nothing_changes(tmp_path: Path) -> None:
    for number in range(3):
        write_tarfile(tmp_path / f"{number}.tar", sample_members("", 3))
    (tmp_path / "1.tar").chmod(0o444)
    before = snapshot(tmp_path)
    result = run_shardprep("prepare", str(tmp_path), *FLAGS, "--fix-duplicates", honour_permissions=True)
    assert result.returncode == 1
    assert (
        "1.tar: cannot be renamed in place: it cannot be opened for writing (Permission denied)"
        in result.stderr
    )
    assert "chmod u+w" in result.stderr
    assert snapshot(tmp_path) == before


KILLED_HALFWAY = """
import os, signal, sys
import prep.tar.patch as patch

real = patch.write_blocks
shards = []


def write_then_die(fd, offsets, blocks):
    shards.append(fd)
    if len(shards) == 2:  # the second shard: half of its blocks written, then killed
        half = len(offsets) // 2
        real(fd, offsets[:half], blocks[:half])
        os.fsync(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd, offsets, blocks)


patch.write_blocks = write_then_die
from prep.cli import main

main(sys.argv[1:])
"""


FAILING_HALFWAY = KILLED_HALFWAY.replace(
    "os.kill(os.getpid(), signal.SIGKILL)", "raise OSError(5, 'Input/output error', 'the disk')"
)


def test_fix_failing_halfway_says_how_to_finish_and_the_next_run_does(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    for number in range(3):
        write_tarfile(dataset / f"{number}.tar", sample_members("", 20))
    expected = fixed_copy(dataset, "expected")
    failed = subprocess.run(
        [sys.executable, "-c", FAILING_HALFWAY, "prepare", str(dataset), *FLAGS, "--fix-duplicates"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert failed.returncode == 1, failed.stderr
    assert "--fix-duplicates stopped after renaming" in failed.stderr
    assert "Input/output error (the disk)" in failed.stderr and "--fix-duplicates` to finish" in failed.stderr
    assert "Traceback" not in failed.stderr
    run_shardprep("prepare", str(dataset), *FLAGS, "--fix-duplicates", check=True)
    assert shard_bytes(dataset) == shard_bytes(expected)
    assert not (dataset / FIX_FOLDER).exists()


def without_lock(state: dict) -> dict:
    return {name: value for name, value in state.items() if name != ".shardprep.lock"}


def fixed_copy(dataset: Path, name: str) -> Path:
    """The dataset's shards as an uninterrupted `--fix-duplicates` leaves them (on a copy)."""
    copy = twin(dataset, name)
    run_shardprep("prepare", str(copy), *FLAGS, "--fix-duplicates", check=True)
    return copy


def test_fix_killed_halfway_is_refused_then_finished_by_the_next_run(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    for number in range(3):
        write_tarfile(dataset / f"{number}.tar", sample_members("", 20))
    expected = fixed_copy(dataset, "expected")
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_HALFWAY,
            "prepare",
            str(dataset),
            *FLAGS,
            "--num-workers",
            "1",
            "--fix-duplicates",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    journal = dataset / FIX_FOLDER / ("1.tar" + JOURNAL_SUFFIX)
    assert journal.is_file() and (dataset / FIX_FOLDER / PLAN).is_file()
    half = (dataset / "1.tar").read_bytes()
    assert half != (expected / "1.tar").read_bytes() and b"1.tar/00000.json" in half

    # A prepare without --fix-duplicates must not index half-renamed shards: it says what to run.
    before = snapshot(dataset)
    refused = run_shardprep("prepare", str(dataset), *FLAGS)
    assert refused.returncode == 1
    assert (
        "unfinished --fix-duplicates" in refused.stderr and "--fix-duplicates` to finish it" in refused.stderr
    )
    assert without_lock(snapshot(dataset)) == without_lock(before)  # the killed run's lock file goes

    finished = run_shardprep("prepare", str(dataset), *FLAGS, "--fix-duplicates", check=True)
    assert "2 of 3 shards still to rename" in finished.stdout
    assert "No duplicate keys found, continuing." in finished.stdout
    assert shard_bytes(dataset) == shard_bytes(expected)
    assert_same_index(dataset, expected, dataset_yaml=None)
    assert not (dataset / FIX_FOLDER).exists()


def journaled_plan(dataset: Path) -> tuple[Path, Path, object]:
    """The state a fix of shards 0.tar and 1.tar is in once it has planned and journaled 0.tar: (the fix
    folder, 0.tar's journal, 0.tar's renameable headers)."""
    folder = dataset / FIX_FOLDER
    folder.mkdir()
    plan = {
        "format": 1,
        "shards": [{"shard": s, "size": (dataset / s).stat().st_size} for s in ("0.tar", "1.tar")],
    }
    (folder / PLAN).write_text(json.dumps(plan))
    journal = folder / ("0.tar" + JOURNAL_SUFFIX)
    headers = renameable_headers("0.tar", (dataset / "0.tar").read_bytes())
    write_journal(journal, dataset / "0.tar", "0.tar", headers.offsets, headers.blocks)
    return folder, journal, headers


def test_a_header_torn_mid_write_is_finished_from_the_journal(tmp_path: Path) -> None:
    """Killed inside one block's write: that header is part renamed, part original; the next run
    finishes it from the journal, as it finishes the whole ones."""
    dataset = tmp_path / "dataset"
    for number in range(2):
        write_tarfile(dataset / f"{number}.tar", sample_members("", 10))
    expected = fixed_copy(dataset, "expected")
    folder, _, headers = journaled_plan(dataset)
    renamed = (expected / "0.tar").read_bytes()
    with open(dataset / "0.tar", "r+b") as shard:
        first, second = (int(offset) for offset in headers.offsets[:2])
        shard.seek(first)
        shard.write(renamed[first : first + 512])
        shard.seek(second)
        shard.write(renamed[second : second + 100])  # the kill came 100 bytes into this block
    run_shardprep("prepare", str(dataset), *FLAGS, "--fix-duplicates", check=True)
    assert shard_bytes(dataset) == shard_bytes(expected)
    assert not folder.exists()


def test_torn_journal_means_an_untouched_shard_which_the_next_run_renames(tmp_path: Path) -> None:
    """Killed while writing the journal: the shard was not touched yet, and is renamed from scratch."""
    dataset = tmp_path / "dataset"
    for number in range(2):
        write_tarfile(dataset / f"{number}.tar", sample_members("", 10))
    expected = fixed_copy(dataset, "expected")
    folder, journal, headers = journaled_plan(dataset)
    journal.write_bytes(journal.read_bytes()[:-700])  # cut short, as by a kill mid-write
    run_shardprep("prepare", str(dataset), *FLAGS, "--fix-duplicates", check=True)
    assert shard_bytes(dataset) == shard_bytes(expected)
    assert not folder.exists()


def test_shard_changed_after_an_interrupted_fix_is_left_alone(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    for number in range(2):
        write_tarfile(dataset / f"{number}.tar", sample_members("", 4))
    journaled_plan(dataset)
    # Someone re-wrote the shard with other names (same size) before the fix was finished.
    write_tarfile(dataset / "0.tar", sample_members("x", 4))
    before = snapshot(dataset)
    result = run_shardprep("prepare", str(dataset), *FLAGS, "--fix-duplicates")
    assert result.returncode == 1
    assert "0.tar at byte 0: the header there is neither its original nor its renamed form" in result.stderr
    assert snapshot(dataset) == before


def test_renamed_headers_equal_energons_update_header() -> None:
    """Our rename of headers, one by one and many at once, against energon's own (numba) `update_header`,
    on names of every length around the field limits, in ustar, GNU and V7 headers."""
    pytest.importorskip("numba", reason="energon's TarPatcher needs its tar-patcher extra (numba)")
    import numpy as np
    from megatron.energon.flavors.webdataset.tar_patcher import TarPatcherError, update_header

    chooser = random.Random(7)
    cases: dict[bytes, list[tuple[bytes, bytes | None]]] = {}
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, None):
        for _ in range(300):
            parts = [chooser.choice("abc") * chooser.randint(1, 60) for _ in range(chooser.randint(1, 5))]
            name = "/".join(parts) + ".txt"
            if len(name) > 100 and fmt is not tarfile.USTAR_FORMAT:
                continue
            try:
                block = tarfile.TarInfo(name).tobuf(fmt or tarfile.USTAR_FORMAT, "utf-8", "strict")[-512:]
            except ValueError:
                continue
            if fmt is None:  # a V7 header: no magic
                block = with_checksums([block[:257] + bytes(255)])[0]
            prefix = shard_prefix(chooser.choice(["0.tar", "sub/dir/shard-000123.tar", "p" * 40 + ".tar"]))
            theirs = np.frombuffer(block, dtype=np.uint8).copy()
            try:
                update_header(theirs, np.frombuffer(prefix, dtype=np.uint8))
                expected: bytes | None = theirs.tobytes()
            except TarPatcherError:
                expected = None
            cases.setdefault(prefix, []).append((block, expected))
    for prefix, pairs in cases.items():
        blocks = np.frombuffer(b"".join(block for block, _ in pairs), dtype=np.uint8).reshape(-1, 512)
        renamed, fits = prefixed_blocks(blocks, prefix)
        for row, (block, expected) in enumerate(pairs):
            one = prefixed_block(block, prefix)
            assert (with_checksums([one])[0] if one is not None else None) == expected, (block[:100], prefix)
            assert (renamed[row].tobytes() if fits[row] else None) == expected, (block[:100], prefix)
            if expected is not None:
                assert header_path(expected)[0] == prefix + header_path(block)[0]
    assert sum(len(pairs) for pairs in cases.values()) > 500
    assert any(expected is None for pairs in cases.values() for _, expected in pairs)
