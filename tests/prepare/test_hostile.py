"""Hostile datasets: names that try to climb out, NUL and newlines, 64 KB names, deep folders, shards
that are links out of the dataset, a million empty members, YAML that asks to run code, and a
sample_loader.py. prepare indexes them exactly as energon does, and no command runs code from a dataset."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import numpy as np

from prep.tar.fields import BLOCK
from tests.support.prepare import assert_same_index, run_energon_prepare, run_shardprep, twin
from tests.support.shards import hostile_shard, sample_members, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]


def test_hostile_names_index_as_energon_indexes_them(tmp_path: Path) -> None:
    dataset = tmp_path / "hostile"
    hostile_shard(dataset / "a.tar")
    write_tarfile(dataset / "b.tar", sample_members("b-", 3))
    theirs = twin(dataset, "hostile-energon")
    run_shardprep("prepare", str(dataset), *FLAGS, "--sample-type", "CrudeWebdataset", check=True)
    run_energon_prepare(str(theirs), *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(dataset, theirs)
    for command in (
        ["info", str(dataset)],
        ["verify", "--deep", str(dataset)],
        ["preview", str(dataset), "-n", "20"],
    ):
        result = run_shardprep(*command)
        assert result.returncode == 0 and "Traceback" not in result.stderr, (command, result.stderr)


def test_shards_linked_from_outside_the_dataset_are_followed_as_energon_follows_them(tmp_path: Path) -> None:
    """A linked shard, and a linked folder of shards: both indexed (energon's glob follows links too).
    Each `.tar.idx` goes beside the path the dataset names, so into the linked folder for the second."""
    outside = write_tarfile(tmp_path / "elsewhere" / "real.tar", sample_members("o-", 4))
    folder = write_tarfile(tmp_path / "other-place" / "more.tar", sample_members("m-", 3)).parent
    datasets = []
    for name in ("linked", "linked-energon"):
        dataset = tmp_path / name
        write_tarfile(dataset / "a.tar", sample_members("a-", 2))
        (dataset / "b.tar").symlink_to(outside)
        (dataset / "sub").symlink_to(folder, target_is_directory=True)
        datasets.append(dataset)
    ours, theirs = datasets
    run_shardprep("prepare", str(ours), *FLAGS, "--sample-type", "CrudeWebdataset", check=True)
    assert (ours / "b.tar.idx").is_file() and not (ours / "b.tar.idx").is_symlink()
    assert not (outside.parent / "real.tar.idx").exists()
    counts = (ours / ".nv-meta" / ".info.json").read_text()
    assert '"b.tar": 4' in counts and '"sub/more.tar": 3' in counts
    ours_sub_index = (folder / "more.tar.idx").read_bytes()
    run_energon_prepare(str(theirs), *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(ours, theirs)
    assert (folder / "more.tar.idx").read_bytes() == ours_sub_index


def test_dataset_yaml_asking_to_run_code_is_never_run(tmp_path: Path) -> None:
    dataset = tmp_path / "d"
    write_tarfile(dataset / "a.tar", sample_members("a-", 2))
    run_shardprep("prepare", str(dataset), *FLAGS, "--sample-type", "CrudeWebdataset", check=True)
    marker = tmp_path / "code-ran"
    (dataset / ".nv-meta" / "dataset.yaml").write_text(
        f"__module__: megatron.energon\n__class__: CrudeWebdataset\n"
        f"evil: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    (dataset / ".nv-meta" / "sample_loader.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "def sample_loader(raw):\n    return raw\n\ndef part_filter(part):\n    return True\n"
    )
    for command in (
        ["prepare", str(dataset), *FLAGS, "--force-overwrite"],
        ["info", str(dataset)],
        ["verify", str(dataset)],
        ["verify", "--deep", str(dataset)],
        ["preview", str(dataset)],
    ):
        result = run_shardprep(*command)
        assert "Traceback" not in result.stderr, (command, result.stderr)
    assert not marker.exists(), "a command ran code from the dataset"
    assert "!!python" in (dataset / ".nv-meta" / "dataset.yaml").read_text(), (
        "prepare replaced the user's file"
    )


def million_empty_members(path: Path, count: int) -> None:
    """`count` zero-byte members `{i:07d}.{txt|json}` (two per sample), built as numpy header blocks."""
    headers = np.zeros((count, BLOCK), dtype=np.uint8)
    numbers = np.arange(count)
    digits = np.stack([(numbers // 2 // 10**power) % 10 for power in range(6, -1, -1)], axis=1) + ord("0")
    headers[:, 0:7] = digits
    suffix = np.where(numbers % 2 == 0, 0, 1)
    headers[:, 7:12] = np.array([list(b".txt\0"), list(b".json")], dtype=np.uint8)[suffix]
    headers[:, 100:108] = np.frombuffer(b"0000644\0", dtype=np.uint8)
    headers[:, 124:136] = np.frombuffer(b"00000000000\0", dtype=np.uint8)
    headers[:, 136:148] = np.frombuffer(b"14530000000\0", dtype=np.uint8)
    headers[:, 156] = ord("0")
    headers[:, 257:265] = np.frombuffer(b"ustar\x0000", dtype=np.uint8)
    headers[:, 148:156] = ord(" ")
    checksums = headers.sum(axis=1, dtype=np.int64)
    text = np.array(
        [list(f"{value:06o}\0 ".encode()) for value in range(checksums.max() + 1)], dtype=np.uint8
    )
    headers[:, 148:156] = text[checksums]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.write(headers.tobytes())
        out.write(bytes(2 * BLOCK))


def test_a_million_empty_members_index_in_bounded_time(tmp_path: Path) -> None:
    shard = tmp_path / "d" / "empty-members.tar"
    million_empty_members(shard, 1_000_000)
    with tarfile.open(shard) as tar:  # the test's own shard is a real tar
        first = [tar.next() for _ in range(3)]
    assert [member.name for member in first] == ["0000000.txt", "0000000.json", "0000001.txt"]
    started = time.perf_counter()
    result = run_shardprep("prepare", str(shard.parent), *FLAGS, "--crude", check=True)
    elapsed = time.perf_counter() - started
    assert "indexed 500000 samples in 1 shards" in result.stdout
    assert elapsed < 120, f"prepare took {elapsed:.1f} s"
    verify = run_shardprep("verify", str(shard.parent))
    assert verify.returncode == 0, verify.stdout
